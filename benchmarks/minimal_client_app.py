"""A ClientApp with the least glue that still answers the round driver's FedAvg train messages (benchmarks only).

It learns exactly as ``client_app.app``'s FedAvg trainer does: the received weights loaded into a model, the
global model evaluated on the local test split, one local training with the same seeded shuffles, the local
model evaluated, the trained weights and the same metrics sent back. So a federation's numbers are identical
(``bench_client_floor`` checks it). Left out is everything the real ClientApp adds per message: the model
pool's proofs that a reused model is as good as new, client-state binding and checkpointable state, the method
registry and trainer objects, device choice, per-message config checks. One model per (run config, input shape, classes)
is kept for the process and reused unchecked, which is only right for a method that leaves the model's
structure alone (FedAvg). Query and evaluate messages go to the real ClientApp's handlers.

What this ClientApp still costs on top of the plain loop is the floor of Flower's Message API, the engine's
boundary copies and the server's per-update work, which no change to the real ClientApp can remove.
"""

from __future__ import annotations

import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

import client_app.app as real
from client_app.training import OptimConfig, evaluate, local_train
from flcore.records import metric_record, model_views, params_to_record, record_views
from flcore.state_binding import ENTRIES_METRIC
from models import build_model

app = ClientApp()
_MODELS: dict[tuple, torch.nn.Module] = {}


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = real._config(msg, context)
    cid, data = real.load_client_data(cfg, context.node_config, torch.device("cpu"))
    shape, classes = tuple(data.x_train.shape[1:]), data.num_classes
    key = (cfg, shape, classes)  # every run-config value: another model config builds anew
    model = _MODELS.get(key)
    if model is None:
        model = _MODELS[key] = build_model(cfg, shape, classes)
    with torch.no_grad():
        for (_, tensor), value in zip(model.state_dict(keep_vars=True).items(),
                                      record_views(msg.content["arrays"]).values()):
            tensor.detach().numpy()[...] = value
    server_round = int(msg.content["config"]["server-round"])
    g_loss, g_acc = evaluate(model, data.x_test, data.y_test)
    optim = OptimConfig(lr=cfg.lr, epochs=cfg.local_epochs, batch_size=cfg.batch_size, momentum=cfg.momentum,
                        weight_decay=cfg.weight_decay, max_steps=cfg.max_local_steps)
    stats = local_train(model, data.x_train, data.y_train, optim,
                        generator=real._generator(cfg, server_round, cid, msg.metadata.message_type))
    l_loss, l_acc = evaluate(model, data.x_test, data.y_test)
    metrics = {"cid": cid, "num-examples": data.num_train, "train_loss": stats.mean_loss, "local-steps": stats.steps,
               "local-accuracy": l_acc, "local-loss": l_loss, "global-model-local-accuracy": g_acc,
               "global-model-local-loss": g_loss, ENTRIES_METRIC: 0}
    return Message(RecordDict({"arrays": params_to_record(model_views(model)), "metrics": metric_record(metrics)}),
                   reply_to=msg)


app.query()(real.query)
app.evaluate()(real.evaluate)
