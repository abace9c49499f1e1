"""The basic P-FL baselines' clients (flcore/methods/pfl_basic.py): ``split`` (local, FedPer: personal entries
kept in the client state), ``ditto`` (the personal model v_k), ``fedbabu`` (body-only training, fine-tuned
P-FL) and ``fedrod`` (balanced-softmax generic model, personal head)."""
