"""Test helpers for the baseline methods (issue 3): tiny data, jobs, and a Flower-free round driver.

The driver does what ClientApp._train and FLStrategy.train_round do, minus the messaging: the strategy
builds each client's message content, the method's trainer runs on a TrainJob made from it, and the reply
goes through the strategy's own collect_updates (validation) and aggregate.
"""

from __future__ import annotations

import re
from dataclasses import fields
from types import SimpleNamespace
from typing import Any, Mapping

import numpy as np
import torch
from flwr.app import MetricRecord, RecordDict

from client_app.state import ClientState
from client_app.trainers.base import ClientData, TrainJob
from flcore.config import CommonConfig, RunConfig, resolve_run_config
from flcore.records import params_to_record, record_to_params
from flcore.registry import get_method, resolve
from models import build_model
from strategies.base import ClientInfo

DIM, CLASSES = 6, 3


def run_config_keys(method: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword overrides as run-config keys: a keyword names a common key (``local_epochs`` ->
    ``local-epochs``) or, when no common key has that name, a field of ``method``'s section (``tau`` ->
    ``moon.tau``); dashed and dotted keys (``{"fedprox.mu": 0.1}``) pass through unchanged."""
    section = get_method(method).config
    section_fields = {f.name for f in fields(section)} if section is not None else set()
    common = {CommonConfig.key_of(f.name) for f in fields(CommonConfig)}
    out = {}
    for name, value in overrides.items():
        key = name.replace("_", "-")
        if key not in common and "." not in name and name in section_fields:
            key = section.key_of(name)
        out[key] = value
    return out


def make_cfg(**overrides: Any) -> RunConfig:
    """A parsed run config for the tiny synthetic setting; keywords as in :func:`run_config_keys`
    (``make_cfg(method="moon", tau=0.5)`` sets ``moon.tau``)."""
    base: dict[str, Any] = {"model": "mlp", "batch-size": 8, "lr": 0.1, "local-epochs": 1, "dataset": "synthetic",
                            "partition": "natural", "min-train-nodes": 1}
    base.update(run_config_keys(overrides.get("method", "fedavg"), overrides))
    return RunConfig.from_dict(resolve_run_config(base))


def bound_error(key: str, value: Any, allowed: str) -> str:
    """The regex of the ConfigError a declared bound raises: it names the key, the bad value and what is
    allowed (flcore/schema.py)."""
    return re.escape(f"run-config key '{key}' got {value!r}; allowed: {allowed}")


def make_data(seed: int, n: int = 24, n_test: int = 8) -> ClientData:
    """Gaussian blobs around class-specific means, with a client-specific class skew."""
    g = torch.Generator().manual_seed(1000 + seed)
    centres = torch.randn(CLASSES, DIM, generator=torch.Generator().manual_seed(7)) * 2.0
    probs = torch.softmax(torch.randn(CLASSES, generator=g) * 2.0, 0)

    def draw(m: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.multinomial(probs, m, replacement=True, generator=g)
        return centres[y] + torch.randn(m, DIM, generator=g), y

    x, y = draw(n)
    xt, yt = draw(n_test)
    return ClientData(x, y, xt, yt, CLASSES)


def make_model(cfg: RunConfig):
    return build_model(cfg, (DIM,), CLASSES)


def initial_params(cfg: RunConfig):
    return {k: v.detach().cpu().numpy().copy() for k, v in make_model(cfg).state_dict().items()}


def make_job(cfg: RunConfig, cid: int, rnd: int, params, data: ClientData, state_rd: RecordDict,
             content: RecordDict | None = None) -> TrainJob:
    model = make_model(cfg)
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in params.items()})
    content = content if content is not None else RecordDict()
    config = dict(content["config"]) if "config" in content else {}
    records = {k: v for k, v in content.items() if k not in ("arrays", "config", "run_config")}
    return TrainJob(cfg=cfg, cid=cid, server_round=rnd, model=model,
                    global_params={k: v.detach().clone() for k, v in model.state_dict().items()},
                    data=data, config=config, records=records, state=ClientState(state_rd, cid),
                    device=torch.device("cpu"), generator=torch.Generator().manual_seed(100 * rnd + cid))


def run_client(cfg: RunConfig, strategy, cid: int, rnd: int, params, data: ClientData, state_rd: RecordDict,
               trainer_path: str | None = None):
    """Run the method's trainer on the message the strategy would send; return the trainer and reply content."""
    content = strategy.train_content(rnd, cid, params)
    job = make_job(cfg, cid, rnd, record_to_params(content["arrays"]), data, state_rd, content)
    trainer = resolve(trainer_path or get_method(cfg.method).trainer)(job)
    reply = trainer.run()
    out = RecordDict({"arrays": params_to_record(reply.params), "metrics": MetricRecord(reply.metrics)})
    for key, rec in reply.records.items():
        out[key] = rec
    return trainer, out


def register(strategy, datas: dict[int, ClientData]) -> None:
    for cid, d in datas.items():
        strategy.clients[cid] = ClientInfo(cid, 10_000 + cid, d.num_train, d.class_counts())


def register_sizes(strategy, sizes: dict[int, int]) -> None:
    """Register clients with only their training-set sizes (replies must claim the registered size)."""
    for cid, n in sizes.items():
        strategy.clients[cid] = ClientInfo(cid, 10_000 + cid, n, [n] + [0] * (CLASSES - 1))


def run_round(cfg: RunConfig, strategy, rnd: int, params, datas: dict[int, ClientData],
              states: dict[int, RecordDict], sampled: list[int]):
    """One round over ``sampled`` clients through the strategy's validation and aggregation."""
    replies = {}
    for cid in sampled:
        _, content = run_client(cfg, strategy, cid, rnd, params, datas[cid], states[cid])
        replies[cid] = SimpleNamespace(content=content)
    updates, rejected = strategy.collect_updates(rnd, replies, params)
    assert not rejected, rejected
    return strategy.aggregate(rnd, params, updates), updates
