"""The NumPyClient face: the client side of every method whose exchange fits Flower's fit/evaluate, as the
``client_fn`` users hand to Flower::

    from flwr.clientapp import ClientApp
    from client_app.numpy_client import client_fn
    app = ClientApp(client_fn=client_fn)          # the same object: client_app.numpy_client:app

It runs the very trainer classes of the Message-API ClientApp (client_app/app.py: :func:`train_on_node`,
same ClientState in ``context.state``), so a method trains identically through either face. The method,
data and every setting come from the run config: the keys ``run-config.<key>`` of the fit/evaluate config
when the server sends them (this project's strategies through server_app/numpy_grid.py do), else the
run config of the node's Context (a `flwr run` of this app puts every key there).

Flower's legacy records (``fitins.parameters`` / ``fitins.config`` -> ``fitres.*``) carry one list of
arrays and scalars, so methods that exchange other arrays (SCAFFOLD, FedETF/FedGMV) or several messages
per round (FedUFO) are refused with the reason (flcore/faces.py; docs/PROTOCOL.md). Server sides that
speak these records (both tested): this project's strategies through ``NumPyClientGrid``
(server_app/numpy_grid.py), and Flower's legacy stack (``flwr.server.compat.start_grid`` with a
``flwr.server.strategy`` strategy). Flower's Message-API strategies (``flwr.serverapp``) send
"arrays"/"config" and cannot drive a ``client_fn`` app (they drive client_app.app:app instead).
"""

from __future__ import annotations

import functools

import numpy as np
from flwr.app import Context
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp

from client_app.app import ClientSetupError, evaluate_on_node, node_info, parse_run_config, train_on_node
from data_partitioning.datasets import dataset_shape
from flcore.config import RunConfig
from flcore.faces import encode_counts, numpy_client_problem, split_run_config
from flcore.records import model_params
from flcore.registry import get_method
from models import build_model

Config = dict[str, bool | bytes | float | int | str]


@functools.lru_cache(maxsize=8)
def _initial(cfg: RunConfig) -> dict[str, np.ndarray]:
    """The seeded initial model's state, once per run config (the config is the key: every value)."""
    shape, classes = dataset_shape(cfg.dataset)
    return dict(model_params(build_model(cfg, shape, classes)))


class MethodNumPyClient(NumPyClient):
    """One node of any NumPyClient-capable method (the run config's ``method``)."""

    def __init__(self, context: Context) -> None:
        self.node = context

    def _setup(self, config: Config) -> tuple[RunConfig, dict]:
        """(run config, the config without its run-config keys); refuses methods that do not fit."""
        rest, run = split_run_config(config)
        if run:
            cfg = parse_run_config(run, "the fit/evaluate config's 'run-config.*' keys")
        else:
            cfg = parse_run_config(self.node.run_config, "the node's Context (the server sent no "
                                                         "'run-config.*' keys)")
        problem = numpy_client_problem(get_method(cfg.method))
        if problem is not None:
            raise ClientSetupError(f"no NumPyClient face: {problem}; use the Message-API ClientApp "
                                   "(client_app.app:app)")
        return cfg, rest

    def _named(self, cfg: RunConfig, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        """The received list, named in the model's state-dict order (the order get_parameters/fit return)."""
        names = list(_initial(cfg))
        if len(arrays) != len(names):
            raise ClientSetupError(f"received {len(arrays)} arrays, the {cfg.method} model "
                                   f"({cfg.model}, {cfg.dataset}) has {len(names)} state-dict entries")
        return dict(zip(names, arrays))

    def get_properties(self, config: Config) -> Config:
        """Registration: stable client id, training-set size, class counts (as "n0,n1,...")."""
        info = node_info(self._setup(config)[0], self.node)
        return {"cid": info["cid"], "num-examples": info["num-examples"],
                "class-counts": encode_counts(info["class-counts"])}

    def get_parameters(self, config: Config) -> list[np.ndarray]:
        """The seeded initial model (the same on every node and on the server)."""
        cfg = self._setup(config)[0]
        return list(_initial(cfg).values())

    def fit(self, parameters: list[np.ndarray], config: Config) -> tuple[list[np.ndarray], int, Config]:
        cfg, per_client = self._setup(config)
        reply = train_on_node(cfg, self.node, per_client, self._named(cfg, parameters), {}, "train")
        if reply.records:
            raise ClientSetupError(f"{cfg.method}'s trainer returned records {sorted(reply.records)}, which "
                                   "a NumPyClient cannot send")
        # arrays of their own: a trainer's reply may view the model's memory, which the next message reuses
        return [np.array(v) for v in reply.params.values()], int(reply.metrics["num-examples"]), dict(reply.metrics)

    def evaluate(self, parameters: list[np.ndarray], config: Config) -> tuple[float, int, Config]:
        """(loss, test-set size, the evaluate metrics of docs/PROTOCOL.md)."""
        cfg = self._setup(config)[0]
        metrics = evaluate_on_node(cfg, self.node, self._named(cfg, parameters))
        return float(metrics["loss"]), int(metrics["num-test"]), metrics


def client_fn(context: Context) -> Client:
    """Flower's ``client_fn``: this node's NumPyClient as a ``Client``."""
    return MethodNumPyClient(context).to_client()


app = ClientApp(client_fn=client_fn)
