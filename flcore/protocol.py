"""The base protocol between this project's ServerApp and ClientApp (docs/PROTOCOL.md), by name.

Every method adds only what its declaration's ``Payload`` names (flcore/methods/*); the contract test
(tests/test_method_contract.py) checks every registered method's messages against these names.
"""

# record names in server -> client messages
RUN_CONFIG = "run_config"   # ConfigRecord: the whole run config (every key); absent -> the Context's run config
ARRAYS = "arrays"           # ArrayRecord: the model's state dict (train, evaluate)
CONFIG = "config"           # ConfigRecord: per-client values
INFO = "info"               # ConfigRecord in the query reply
CLIENT_STATE = "client-state"  # ConfigRecord in train messages: which run's client state, which versions
                               # (flcore/state_binding.py); absent -> state bound to the Context's Flower run

SERVER_RECORDS = (RUN_CONFIG, ARRAYS, CONFIG, CLIENT_STATE)
CONFIG_KEYS = ("server-round", "cid")
CLIENT_STATE_KEYS = ("run", "attempts", "starts", "checkpoint-round", "state-round")
QUERY_INFO_KEYS = ("cid", "num-examples", "class-counts")

# client -> server
METRICS = "metrics"
REPLY_RECORDS = (ARRAYS, METRICS)
STATE_ENTRIES = "state-entries"  # train metric: client-state entries the client keeps after this training
STATE_MISSING = "client state missing"  # starts the error reason of a client refusing to train without its state
TRAIN_METRICS = ("cid", "num-examples", "train_loss", "local-steps", "local-accuracy", "local-loss",
                 "global-model-local-accuracy", "global-model-local-loss", STATE_ENTRIES)
EVAL_METRICS = ("cid", "num-examples", "num-test", "accuracy", "loss")

# message types
QUERY, TRAIN, EVALUATE = "query", "train", "evaluate"
