"""FedUFO's client side (Zhang et al., ICCV 2021, seed 002; docs/FEDUFO.md), one package:

- :mod:`client_app.trainers.fedufo.trainer`    ``FedUFOTrainer``: the prior and posterior phases of a round
  (what each message type trains, what it replies), the stage's objective assembled from the terms;
- :mod:`client_app.trainers.fedufo.loss_terms` the objective's terms for the one local loop (the prior-feature
  bank, L_uniform, the discriminator's updates on L^d_cls, CGR, CGL), each a ``LossTerm``;
- :mod:`client_app.trainers.fedufo.equations`  the paper's equations as pure tensor functions (Eqs. 4, 5, 7, 8,
  10), unit-tested one by one.

The keys, the stages' terms and the config section are the declaration's (flcore/methods/fedufo.py), the
server side (stage schedule, group statistics, relay, sampling) is strategies/methods/fedufo.py, the
discriminator module models/extras.py.
"""
