"""The base protocol between this project's ServerApp and ClientApp (docs/PROTOCOL.md), by name.

Every method adds only what its declaration's ``Payload`` names (flcore/methods/*); the contract test
(tests/test_method_contract.py) checks every registered method's messages against these names.
"""

# record names in server -> client messages
RUN_CONFIG = "run_config"   # ConfigRecord: the whole run config (every key); absent -> the Context's run config
ARRAYS = "arrays"           # ArrayRecord: the model's state dict (train, evaluate)
CONFIG = "config"           # ConfigRecord: per-client values
INFO = "info"               # ConfigRecord in the query reply

SERVER_RECORDS = (RUN_CONFIG, ARRAYS, CONFIG)
CONFIG_KEYS = ("server-round", "cid")
QUERY_INFO_KEYS = ("cid", "num-examples", "class-counts")

# client -> server
METRICS = "metrics"
REPLY_RECORDS = (ARRAYS, METRICS)
TRAIN_METRICS = ("cid", "num-examples", "train_loss", "local-steps", "local-accuracy", "local-loss",
                 "global-model-local-accuracy", "global-model-local-loss")
EVAL_METRICS = ("cid", "num-examples", "num-test", "accuracy", "loss")

# message types
QUERY, TRAIN, EVALUATE = "query", "train", "evaluate"
