"""The ClientApp: thin Flower glue around the method trainers.

Message actions:
    query            -> register: this node's stable client id, data size and class counts
    train, train.<a> -> the method's Trainer (job.phase = message type, e.g. "train.prior" for FedUFO,
                        "train.calibrate" for SphereFed's calibration statistics, "train.means" for FedMix's
                        shared means, "train.meta" for FedMeta's meta share)
    evaluate         -> the global model on this client's local test split

The server sends its full run config in every message (record "run_config"), so clients always train
with exactly the server's settings; a message without one (Flower's stock strategies) uses the run config
of the node's Context (docs/PROTOCOL.md). Each handler reads its message and calls a node-level function
(:func:`node_info`, :func:`train_on_node`, :func:`evaluate_on_node`) that the NumPyClient face
(client_app/numpy_client.py) shares. A node's identity and data come from its node config:
``partition-id`` + ``num-partitions`` (simulation, demos) or ``client-id`` + ``data-path`` (deployments);
``state-dir`` persists client state across SuperNode restarts and resumed runs, bound to the run and
versioned by round as the message's "client-state" record says (client_app/state.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client_app.model_pool import POOL, torch_array
from client_app.state import ClientState
from client_app.trainers.base import ClientData, TrainJob, TrainReply
from client_app.training import evaluate as evaluate_model
from data_partitioning.federated import ClientArrays, client_arrays, node_arrays
from flcore.config import ConfigError, RunConfig
from flcore.records import config_to_record, metric_record, params_to_record, record_dict, record_views
from flcore.registry import get_method, resolve
from flcore.state_binding import ENTRIES_METRIC, RECORD as STATE_RECORD, StateBinding
from models import FLModel, build_model
from models.evaluation import eval_support
from models.numerics import Numerics, applied, check_device, numerics_of

log = logging.getLogger("noniid_fl")
app = ClientApp()


class ClientSetupError(RuntimeError):
    pass


def node_identity(node_config: dict) -> tuple[int, int, str]:
    """(client id, number of partitions, data path) from the node config."""
    data_path = str(node_config.get("data-path", ""))
    if "partition-id" in node_config:
        cid = int(node_config["partition-id"])
    elif "client-id" in node_config:
        cid = int(node_config["client-id"])
    else:
        raise ClientSetupError("node config needs 'partition-id' (with 'num-partitions') or 'client-id' "
                               "(with 'data-path'); got keys " + ", ".join(sorted(node_config)))
    if data_path:
        return cid, 0, data_path
    if "num-partitions" not in node_config:
        raise ClientSetupError(f"client {cid}: node config has 'partition-id' but no 'num-partitions'")
    return cid, int(node_config["num-partitions"]), ""


def pick_device(cfg: RunConfig) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ClientSetupError("run-config device='cuda' but CUDA is not available on this node")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


NODE_NUMERICS = ("precision", "memory-format")


def node_numerics(cfg: RunConfig, node_config: Mapping, device: torch.device) -> Numerics:
    """The run's precision and memory format (models/numerics.py), unless this node's operator set its own
    (``--node-config "precision='bf16-mixed'"``: a node with bf16 instructions or a GPU computes in its best
    precision, the others in the run's; parameters and messages are fp32 either way). Checked against the
    method's declaration and this node's device: a value it cannot run is an error, never a fallback."""
    chosen = numerics_of(cfg)
    own = {k: node_config[k] for k in NODE_NUMERICS if k in node_config}
    try:
        if own:
            chosen = dataclasses.replace(chosen, precision=str(own.get("precision", chosen.precision)),
                                         memory_format=str(own.get("memory-format", chosen.memory_format)))
        refusal = get_method(cfg.method).precision_refusal(chosen.precision)
        if refusal:
            raise ValueError(refusal)
        check_device(chosen, device)
    except ValueError as e:
        where = f"node config {own}" if own else "run config"
        raise ClientSetupError(f"{e} ({where} of this node)") from None
    return chosen


@functools.lru_cache(maxsize=64)
def _cached_arrays(cid: int, num_partitions: int, data_path: str, cfg: RunConfig) -> ClientArrays:
    """A node's arrays, built once per run config: the cache keys on the config itself, i.e. on every run-config
    value, common and sectioned (RunConfig's equality and once-computed hash; no hand-kept list of the keys that
    shape the data, which a new data option or method would have to join)."""
    if data_path:
        return node_arrays(data_path, cfg.local_test_fraction, cfg.seed + cid)
    return client_arrays(cfg, cid, num_partitions)


@functools.lru_cache(maxsize=64)
def _cached_data(cid: int, num_partitions: int, data_path: str, cfg: RunConfig, device: torch.device) -> ClientData:
    """A node's data as tensors on ``device`` (views of the cached arrays on the CPU), built once per config."""
    arr = _cached_arrays(cid, num_partitions, data_path, cfg)
    t = functools.partial(torch.as_tensor, device=device)
    # pfl-eval-split: the split the client's own evaluation (P-FL) reads; 'validation' while tuning
    x_eval, y_eval = (arr.x_val, arr.y_val) if cfg.pfl_eval_split == "validation" else (arr.x_test, arr.y_test)
    if data_path and cfg.pfl_eval_split == "validation":
        raise ClientSetupError(f"client {cid}: pfl-eval-split = 'validation' needs a validation split, which a "
                               f"node's own data file ({data_path}) does not have: use pfl-eval-split = 'test'")
    return ClientData(t(arr.x_train), t(arr.y_train), t(x_eval), t(y_eval), arr.num_classes)


def load_client_data(cfg: RunConfig, node_config: dict, device: torch.device) -> tuple[int, ClientData]:
    cid, num_partitions, data_path = node_identity(node_config)
    try:
        data = _cached_data(cid, num_partitions, data_path, cfg, device)
    except Exception as exc:
        raise ClientSetupError(f"client {cid}: cannot load its data ({cfg.dataset}): {exc}") from exc
    return cid, data


def parse_run_config(values, source: str) -> RunConfig:
    """The run config from ``values`` (every key), parsed once per process (every message of a run carries the
    same config: compared by value and type with the last one); ``source`` names where the values came from
    in the error for an incomplete or invalid one."""
    global _LAST_CONFIG
    last = _LAST_CONFIG
    if last is not None:
        if len(values) == len(last[0]) and all(map(operator.is_, values.keys(), last[3])) and all(
                map(operator.is_, values.values(), last[4])):
            return last[2]  # the very key and value objects, in order, parsed last time (a copied message
            #                 shares them): C-level, no equality or type comparisons
        if values == last[0] and list(map(type, values.values())) == last[1]:
            return last[2]  # (a ConfigRecord compares its items with the dict, C-level: no copy needed)
    values = dict(values.items())
    types = list(map(type, values.values()))
    try:
        cfg = RunConfig.from_dict(values, complete=True)
    except ConfigError as exc:
        raise ClientSetupError(f"the run config from {source} is not usable: {exc}") from exc
    _LAST_CONFIG = (values, types, cfg, list(values.keys()), list(values.values()))
    return cfg


_LAST_CONFIG: tuple | None = None


def _config(msg: Message, context: Context) -> RunConfig:
    """The run config the server sent (record "run_config", every key, validated by the server); a message
    without it (e.g. from Flower's stock FedAvg) uses the run config of the Context."""
    if "run_config" in msg.content:
        return parse_run_config(msg.content["run_config"], "the message's 'run_config' record")
    return parse_run_config(context.run_config, "the node's Context (the message carries no 'run_config' "
                                                "record; a `flwr run` of this app puts every key there)")


def _generator(cfg: RunConfig, server_round: int, cid: int, phase: str) -> torch.Generator:
    seq = np.random.SeedSequence([cfg.seed, server_round, cid, sum(phase.encode())])
    return torch.Generator().manual_seed(int(seq.generate_state(1)[0]))


def _model(cfg: RunConfig, data: ClientData, device: torch.device, params: dict) -> FLModel:
    """The run's model with the received weights (reused from POOL when provably as good as new)."""
    in_shape = tuple(data.x_train.shape[1:])
    key = (cfg, in_shape, data.num_classes, str(device))  # every run-config value: another config builds anew
    model = POOL.get(key, lambda: build_model(cfg, in_shape, data.num_classes).to(device), cfg.seed)
    assert isinstance(model, FLModel)  # built by build_model
    POOL.load(model, params)  # = model.load_state_dict(params as tensors, strict=True)
    return model


class FrozenGlobal(Mapping):
    """The received global state as detached tensors like the model's (device, dtype): what a clone of the
    freshly loaded model's state dict holds (``load_state_dict`` copied ``params`` in with the same casts).
    Each tensor is made on first access, so a trainer that never reads the global state (FedAvg) costs no
    copies; ``params`` are the message's arrays, only read."""

    def __init__(self, params: Mapping[str, np.ndarray], slots: list[tuple[str, torch.Tensor]]) -> None:
        self._params, self._like = params, dict(slots)
        self._made: dict[str, torch.Tensor] = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        t = self._made.get(key)
        if t is None:
            like = self._like[key]
            t = self._made[key] = torch_array(self._params[key]).to(device=like.device, dtype=like.dtype)
        return t

    def __iter__(self):  # noqa: ANN204 - the model's state-dict order
        return iter(self._like)

    def __contains__(self, key: object) -> bool:
        return key in self._like

    def __len__(self) -> int:
        return len(self._like)


def node_info(cfg: RunConfig, context: Context) -> dict:
    """What a node announces at registration: stable client id, training-set size, class counts."""
    cid, data = load_client_data(cfg, context.node_config, torch.device("cpu"))
    return {"cid": cid, "num-examples": data.num_train, "class-counts": data.class_counts()}


def train_on_node(cfg: RunConfig, context: Context, config: dict, params: dict, records: dict,
                  phase: str) -> TrainReply:
    """One local training of the method's trainer from ``params`` with this node's data and client state
    (saved afterwards); ``config`` = the server's per-client values (server-round, ...)."""
    device = pick_device(cfg)
    numerics = node_numerics(cfg, context.node_config, device)
    cid, data = load_client_data(cfg, context.node_config, device)
    server_round = int(config.get("server-round", 0))
    state_dir = str(context.node_config.get("state-dir", "")) or cfg.client_state_dir
    records = dict(records)
    bound = records.pop(STATE_RECORD, None)  # which run's state, which versions (client_app/state.py)
    decl = get_method(cfg.method)
    state = ClientState(context.state, cid, state_dir,
                        StateBinding.from_record(bound) if bound is not None else StateBinding.flower_run(context.run_id),
                        server_round, f"{decl.name} client state ({', '.join(decl.payload.state) or 'undeclared'})")
    model = _model(cfg, data, device, params)
    job = TrainJob(cfg=cfg, cid=cid, server_round=server_round, model=model,
                   global_params=FrozenGlobal(params, POOL.state_items(model)),
                   data=data, config=config, records=records, state=state, device=device,
                   generator=_generator(cfg, server_round, cid, phase), phase=phase)
    with applied(model, numerics, device):  # precision, memory format, TF32: models/numerics.py
        reply = resolve(decl.trainer)(job).run()
    del job
    POOL.give_back(model)
    del model
    state.save(server_round)
    reply.metrics[ENTRIES_METRIC] = len(state.keys())
    return reply


def evaluate_on_node(cfg: RunConfig, context: Context, params: dict) -> dict:
    """The model ``params`` on this node's local test split (num-examples: the training-set size)."""
    device = pick_device(cfg)
    numerics = node_numerics(cfg, context.node_config, device)
    cid, data = load_client_data(cfg, context.node_config, device)
    if int(data.y_test.shape[0]) == 0:
        raise ClientSetupError(f"client {cid} has no local test split (run-config local-test-fraction = "
                               f"{cfg.local_test_fraction}): federated evaluation needs local-test-fraction > 0")
    model = _model(cfg, data, device, params)
    with eval_support(model, data.x_train, (cfg.seed, cid)), applied(model, numerics, device):
        loss, acc = evaluate_model(model, data.x_test, data.y_test)  # eval_support: e.g. FedRANE's inductive one
    POOL.give_back(model)
    del model
    return {"cid": cid, "num-examples": data.num_train, "num-test": int(data.y_test.shape[0]),
            "accuracy": acc, "loss": loss}


def _record(msg: Message, name: str):
    if name not in msg.content:
        raise ClientSetupError(f"'{msg.metadata.message_type}' message has no '{name}' record (docs/PROTOCOL.md); "
                               f"it has: {', '.join(msg.content.keys()) or 'nothing'}")
    return msg.content[name]


@app.query()
def query(msg: Message, context: Context) -> Message:
    info = node_info(_config(msg, context), context)
    return Message(RecordDict({"info": config_to_record(info)}), reply_to=msg)


def _train(msg: Message, context: Context) -> Message:
    records = {k: v for k, v in msg.content.items() if k not in ("arrays", "config", "run_config")}
    reply = train_on_node(_config(msg, context), context, dict(_record(msg, "config")),
                          record_views(_record(msg, "arrays")), records, msg.metadata.message_type)
    content = {"arrays": params_to_record(reply.params), "metrics": metric_record(reply.metrics)}
    if any(key in content for key in reply.records):  # a method record replaces a base one: RecordDict's own way
        out = record_dict(content)
        for key, rec in reply.records.items():
            out[key] = rec
        return Message(out, reply_to=msg)
    return Message(record_dict({**content, **reply.records}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _train(msg, context)


def _declared_actions() -> list[str]:
    """Every "train.<action>" a declared method's strategy sends besides "train" (``Payload.actions``: FedUFO's
    prior and posterior, SphereFed's calibrate, FedMix's means, FedMeta's meta), as Flower's action names."""
    from flcore.registry import methods

    return sorted({a.split(".", 1)[1] for d in methods().values() for a in d.payload.actions
                   if a.startswith("train.")})


# one handler per declared action, all the same training entry (the trainer branches on the phase): a new
# method's exchange is declared in its Payload, not registered here by hand
for _action in _declared_actions():
    app.train(_action)(_train)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    metrics = evaluate_on_node(_config(msg, context), context, record_views(_record(msg, "arrays")))
    return Message(record_dict({"metrics": metric_record(metrics)}), reply_to=msg)
