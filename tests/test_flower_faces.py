"""The faces Flower users expect (issue 16 item 5, issue 20 item 7), on the in-process grid with the real
ClientApps: every single-exchange method under Flower's own ``Strategy.start()`` from a user-written
ServerApp main; the NumPyClient face against its Strategy; Flower's stock FedAvg, unmodified, driving our
ClientApp; and docs/PROTOCOL.md being the generated one."""

from __future__ import annotations

import functools
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns, GetPropertiesIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import Server, ServerConfig, SimpleClientManager
from flwr.server.compat import start_grid
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from client_app import numpy_client
from client_app.app import evaluate_on_node
from data_partitioning.datasets import dataset_shape
from flcore import protocol_doc
from flcore.config import PROJECT_ROOT, RunConfig, resolve_run_config
from flcore.faces import numpy_client_problem, start_problem
from flcore.records import model_params, params_to_record, record_to_params
from flcore.registry import methods
from models import build_model
from server_app.numpy_grid import NumPyClientGrid
from server_app.runner import build_strategy
from strategies.client_registry import RoundFailed
from strategies.flower_api import StartNotSupported
from tests.fakegrid import FakeGrid

TINY = {"dataset": "digits", "num-server-rounds": 2, "batch-size": 16, "max-local-steps": 2, "model": "mlp",
        "checkpoint": False, "min-train-nodes": 3, "fedufo.num-clients": 3, "local-test-fraction": 0.25,
        "federated-eval-every": 1}
START = [n for n, d in methods().items() if start_problem(d) is None]
NUMPY = [n for n, d in methods().items() if numpy_client_problem(d) is None]


def _values(method: str, **over) -> dict:
    return resolve_run_config({**TINY, "method": method, **over})


def _server_context(values: dict) -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=dict(values))


def user_main(grid, context: Context):
    """A minimal user-written ServerApp main (``@app.main()``): the method's Strategy, started by Flower."""
    cfg = RunConfig.from_dict(context.run_config)
    strategy = build_strategy(cfg)
    shape, classes = dataset_shape(cfg.dataset)
    model = build_model(cfg, shape, classes)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=cfg.num_server_rounds, timeout=120)
    return strategy, result


class RecordingGrid(FakeGrid):
    """FakeGrid keeping (message, reply) of every delivery, as the ClientApp saw them."""

    def __init__(self, num_nodes: int, **kw) -> None:
        super().__init__(num_nodes, **kw)
        self.log: list[tuple[Message, Message]] = []

    def _deliver(self, msg: Message) -> Message | None:
        reply = super()._deliver(msg)
        self.log.append((msg, reply))
        return reply

    def replies(self, message_type: str, server_round: int) -> list[Message]:
        return [r for m, r in self.log if m.metadata.message_type == message_type
                and m.metadata.group_id == str(server_round) and not r.has_error()]


def _initial(method: str) -> dict[str, np.ndarray]:
    cfg = RunConfig.from_dict(_values(method))
    shape, classes = dataset_shape(cfg.dataset)
    return dict(model_params(build_model(cfg, shape, classes)))


@functools.lru_cache(maxsize=None)
def _own_driver(method: str) -> dict[str, np.ndarray]:
    """The model after 2 rounds of the project's own round driver (train_round), same seed and grid size."""
    strategy = build_strategy(RunConfig.from_dict(_values(method)))
    grid, params = FakeGrid(3), _initial(method)
    for rnd in (1, 2):
        params = strategy.train_round(grid, rnd, params).params
    return dict(params)


def _train_message(node: int, records: dict) -> Message:
    return Message(RecordDict(records), dst_node_id=node, message_type="train")


def _stock_records() -> dict:
    """What Flower's stock Message-API FedAvg sends: the model and server-round, no run config."""
    return {"arrays": params_to_record(_initial("fedavg")), "config": ConfigRecord({"server-round": 1})}


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def _weighted_mean(replies: list[Message]) -> dict[str, np.ndarray]:
    n = np.array([float(r.content["metrics"]["num-examples"]) for r in replies])
    models = [record_to_params(r.content["arrays"]) for r in replies]
    return {k: sum(w * m[k].astype(np.float64) for w, m in zip(n, models)) / n.sum() for k in models[0]}


# ------------------------------------------------------------------------------- Strategy.start()
def test_the_single_exchange_methods_are_all_but_fedufo():
    # fedufo relays priors within a round; spherefed calibrates its classifier in one more exchange at the end;
    # fedmix asks the clients for their means in one more exchange before a round, fedmeta for its meta share
    assert set(methods()) - set(START) == {"fedufo", "spherefed", "fedmix", "fedmeta"}
    assert set(START) - set(NUMPY) == {"scaffold", "fedetf", "fedgmv", "fedcm", "apple", "fedmtl"}   # a server record each round


@pytest.mark.parametrize("method", START)
def test_flower_start_runs_the_method_as_its_own_driver_does(method):
    grid = RecordingGrid(3)
    strategy, result = user_main(grid, _server_context(_values(method)))
    final, init = record_to_params(result.arrays), _initial(method)
    assert all(np.all(np.isfinite(v)) for v in final.values() if v.dtype.kind == "f")
    if method == "local":  # shares nothing by design: its server's model stays at the initialisation
        assert all(np.array_equal(final[k], init[k]) for k in init)
    else:
        assert any(not np.array_equal(final[k], init[k]) for k in init), "the model did not change"
    # the same registration, sampling, messages, validation and aggregation as train_round: bit for bit
    assert _same(dict(final), _own_driver(method))
    assert Counter(m.metadata.message_type for m, _ in grid.log) == {"query": 3, "train": 6, "evaluate": 6}
    for rnd in (1, 2):
        train = result.train_metrics_clientapp[rnd]
        assert (train["num-updates"], train["num-failures"]) == (3, 0)
        # federated evaluation: the test-set weighted mean of what the clients answered
        answers = [dict(r.content["metrics"]) for r in grid.replies("evaluate", rnd)]
        n = sum(a["num-test"] for a in answers)
        assert len(answers) == 3 and result.evaluate_metrics_clientapp[rnd]["accuracy"] == pytest.approx(
            sum(a["accuracy"] * a["num-test"] for a in answers) / n, rel=1e-12)
    assert strategy.flower_failures == {1: [], 2: []}


def test_flower_start_fedavg_is_the_sample_weighted_mean_and_evaluates_the_final_model():
    values = _values("fedavg")
    grid = RecordingGrid(3)
    _, result = user_main(grid, _server_context(values))
    final = record_to_params(result.arrays)
    last = grid.replies("train", 2)
    sizes = {int(dict(r.content["info"])["cid"]): int(dict(r.content["info"])["num-examples"])
             for r in grid.replies("query", 1)}  # registration happens in round 1's configure_train
    assert sorted(int(r.content["metrics"]["cid"]) for r in last) == [0, 1, 2]
    assert all(int(r.content["metrics"]["num-examples"]) == sizes[int(r.content["metrics"]["cid"])] for r in last)
    mean = _weighted_mean(last)
    for k in final:
        np.testing.assert_allclose(final[k], mean[k], rtol=1e-6, atol=1e-7)
    # the round-2 evaluation saw the final model: client 0's answer, recomputed here
    answer = next(dict(r.content["metrics"]) for r in grid.replies("evaluate", 2) if r.content["metrics"]["cid"] == 0)
    ctx = grid.contexts[grid.node_ids[0]]
    again = evaluate_on_node(RunConfig.from_dict(values), ctx, dict(final))
    assert again["accuracy"] == answer["accuracy"] and again["loss"] == pytest.approx(answer["loss"], rel=1e-6)


def test_flower_start_records_a_failing_client_and_aggregates_the_others():
    grid = RecordingGrid(3, behaviours={1: "raise"})
    strategy, result = user_main(grid, _server_context(_values("fedavg")))
    for rnd in (1, 2):
        assert [(f.cid, f.phase, f.kind) for f in strategy.flower_failures[rnd]] == [(1, "train", "error")]
        assert (result.train_metrics_clientapp[rnd]["num-updates"],
                result.train_metrics_clientapp[rnd]["num-failures"]) == (2, 1)
    final, mean = record_to_params(result.arrays), _weighted_mean(grid.replies("train", 2))
    assert len(grid.replies("train", 2)) == 2
    for k in final:
        np.testing.assert_allclose(final[k], mean[k], rtol=1e-6, atol=1e-7)
    with pytest.raises(RoundFailed, match="1 usable update|2 usable update"):
        user_main(FakeGrid(3, behaviours={1: "raise"}), _server_context(_values("fedavg", **{"min-train-replies": 3})))


def test_fedufo_cannot_run_under_flower_start_and_says_why():
    grid = RecordingGrid(3)
    with pytest.raises(StartNotSupported, match=r"train\.prior.*Strategy\.start\(\).*run_federation"):
        user_main(grid, _server_context(_values("fedufo")))
    assert grid.log == []  # refused before anything was sent


@pytest.mark.parametrize("kwargs, match", [
    ({"num_rounds": 3}, "num-server-rounds=2"),
    ({"train_config": ConfigRecord({"lr": 0.1})}, r"\['lr'\] are run-config keys"),
    ({"train_config": ConfigRecord({"cid": 5})}, "set by the strategy"),
    ({"evaluate_config": ConfigRecord({"server-round": 9})}, "set by the strategy"),
])
def test_flower_start_refuses_what_clients_would_not_read(kwargs, match):
    cfg = RunConfig.from_dict(_values("fedbc"))
    args = {"grid": FakeGrid(3), "initial_arrays": params_to_record(_initial("fedbc")), "num_rounds": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_strategy(cfg).start(**args)


# ------------------------------------------------------------------------------- the NumPyClient face
def _numpy_nodes(num_nodes: int) -> FakeGrid:
    grid = FakeGrid(num_nodes)
    grid.client_app = numpy_client.app
    return grid


@pytest.mark.parametrize("method", NUMPY)
def test_numpy_client_against_its_strategy_trains_as_the_message_api_client(method):
    inner = RecordingGrid(3)
    inner.client_app = numpy_client.app  # the nodes run ClientApp(client_fn=client_fn)
    assert all(ctx.run_config == {} for ctx in inner.contexts.values())  # the run config comes in the messages
    _, result = user_main(NumPyClientGrid(inner), _server_context(_values(method)))
    assert _same(dict(record_to_params(result.arrays)), _own_driver(method))
    # what the nodes received and answered were Flower's legacy records
    seen = {m.metadata.message_type: (sorted(m.content.keys()), sorted(r.content.keys())) for m, r in inner.log}
    assert seen == {
        "get_properties": (["getpropertiesins.config"], ["getpropertiesres.properties", "getpropertiesres.status"]),
        "train": (["fitins.config", "fitins.parameters"],
                  ["fitres.metrics", "fitres.num_examples", "fitres.parameters", "fitres.status"]),
        "evaluate": (["evaluateins.config", "evaluateins.parameters"],
                     ["evaluateres.loss", "evaluateres.metrics", "evaluateres.num_examples", "evaluateres.status"])}
    assert 0.0 <= result.evaluate_metrics_clientapp[2]["accuracy"] <= 1.0


def test_numpy_client_reads_the_context_run_config_and_fits_like_the_clientapp():
    """Without run-config keys in the fit config (a legacy Flower server), the run config of the Context."""
    values = _values("fedbc")
    init = _initial("fedbc")
    config = {"server-round": 1, "cid": 0, "fedbc-lambda": 0.3, "fedbc-gamma": 0.01}
    grid = FakeGrid(1)
    grid.run_config.update(values)
    ctx = grid.contexts[grid.node_ids[0]]
    client = numpy_client.client_fn(ctx)
    res = client.fit(FitIns(ndarrays_to_parameters(list(init.values())), dict(config)))
    got = dict(zip(init, parameters_to_ndarrays(res.parameters)))
    msg = _train_message(grid.node_ids[0], {"run_config": ConfigRecord(values), "arrays": params_to_record(init),
                                            "config": ConfigRecord(config)})
    reply = grid.send_and_receive([msg])[0]
    assert _same(got, dict(record_to_params(reply.content["arrays"])))
    assert res.num_examples == reply.content["metrics"]["num-examples"] > 0
    assert res.metrics["fedbc-lambda"] == 0.3


class _LegacyRunGrid(FakeGrid):
    """Flower's legacy start_grid reads ``grid.run.run_id``."""

    @property
    def run(self):
        return SimpleNamespace(run_id=self.run_id)


def test_flowers_legacy_fedavg_drives_the_numpy_client_with_the_context_run_config():
    """The legacy flwr.server stack (start_grid + flwr.server.strategy.FedAvg) speaks the same records."""
    values = _values("fedavg")
    grid = _LegacyRunGrid(3)
    grid.client_app = numpy_client.app
    grid.run_config.update(values)  # the legacy server sends no run-config keys: the nodes use their Context
    init = list(_initial("fedavg").values())
    strategy = LegacyFedAvg(min_fit_clients=3, min_evaluate_clients=3, min_available_clients=3,
                            initial_parameters=ndarrays_to_parameters(init),
                            on_fit_config_fn=lambda rnd: {"server-round": rnd},
                            on_evaluate_config_fn=lambda rnd: {"server-round": rnd})
    server = Server(client_manager=SimpleClientManager(), strategy=strategy)
    server.set_max_workers(1)  # one client at a time: the in-process grid is sequential
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    try:
        history = start_grid(grid=grid, server=server, config=ServerConfig(num_rounds=2, round_timeout=120))
    finally:  # start_grid claims this process's task identity
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
    final = dict(zip(_initial("fedavg"), parameters_to_ndarrays(server.parameters)))
    _, ours = user_main(FakeGrid(3), _server_context(values))
    for k, v in record_to_params(ours.arrays).items():
        np.testing.assert_allclose(final[k], v, rtol=1e-4, atol=1e-5)
    # round 1 evaluates the same model: both weigh the clients by their test-set size (to float32 rounding: the
    # legacy FedAvg aggregates in its own summation order; 3e-8 relative measured with the momentum-0.9 default)
    assert dict(history.losses_distributed)[1] == pytest.approx(ours.evaluate_metrics_clientapp[1]["loss"], rel=1e-6)


def test_numpy_client_refuses_methods_whose_exchange_does_not_fit():
    grid = FakeGrid(1)
    grid.run_config.update(_values("scaffold"))
    ctx = grid.contexts[1000]
    with pytest.raises(RuntimeError, match="scaffold-c.*client_app.app:app"):
        numpy_client.client_fn(ctx).get_properties(GetPropertiesIns(config={}))
    with pytest.raises(RoundFailed, match="registration failed.*no NumPyClient face: method 'scaffold'"):
        user_main(NumPyClientGrid(_numpy_nodes(3)), _server_context(_values("scaffold")))
    # and the server side refuses to send what a NumPyClient cannot receive
    msg = _train_message(1000, {"arrays": params_to_record(_initial("scaffold")), "config": ConfigRecord({"cid": 0}),
                                "scaffold-c": params_to_record(_initial("scaffold"))})
    with pytest.raises(ValueError, match=r"\['scaffold-c'\] that a NumPyClient cannot receive"):
        NumPyClientGrid.to_legacy(msg)


def test_flowers_message_api_fedavg_cannot_drive_a_client_fn_app():
    """Why the NumPyClient face needs NumPyClientGrid: a client_fn ClientApp reads only legacy records."""
    grid = _numpy_nodes(1)
    grid.run_config.update(_values("fedavg"))
    msg = _train_message(1000, _stock_records())
    reply = grid.send_and_receive([msg])[0]
    assert reply.has_error() and "fitins.parameters" in reply.error.reason


# ------------------------------------------------------------------------------- Flower's stock FedAvg
def test_stock_fedavg_drives_our_clientapp_for_two_rounds():
    values = _values("fedavg")
    grid = RecordingGrid(3)
    grid.run_config.update(values)  # every node's context.run_config: what `flwr run` gives (every key)
    stock = FedAvg(min_train_nodes=3, min_evaluate_nodes=3, min_available_nodes=3)
    result = stock.start(grid=grid, initial_arrays=params_to_record(_initial("fedavg")), num_rounds=2, timeout=120)
    assert all("run_config" not in m.content for m, _ in grid.log)  # so the clients used their Context
    assert Counter(m.metadata.message_type for m, _ in grid.log) == {"train": 6, "evaluate": 6}
    assert all(not r.has_error() for _, r in grid.log)
    final = record_to_params(result.arrays)
    mean = _weighted_mean([r for m, r in grid.log if m.metadata.message_type == "train"][3:])
    for k in final:
        np.testing.assert_allclose(final[k], mean[k], rtol=1e-5, atol=1e-6)
    # the same two rounds as this project's FedAvg under start() (Flower's float32 sums: not bit for bit)
    ours = record_to_params(user_main(FakeGrid(3), _server_context(values))[1].arrays)
    for k in final:
        np.testing.assert_allclose(final[k], ours[k], rtol=1e-4, atol=1e-5)
    assert result.train_metrics_clientapp[2]["train_loss"] > 0
    assert 0.0 <= result.evaluate_metrics_clientapp[2]["accuracy"] <= 1.0


def test_a_message_without_run_config_and_an_empty_context_is_a_clear_error():
    grid = FakeGrid(1)
    msg = _train_message(1000, _stock_records())
    reply = grid.send_and_receive([msg])[0]
    assert reply.has_error() and "node's Context" in reply.error.reason and "lacks key" in reply.error.reason


# ------------------------------------------------------------------------------- docs/PROTOCOL.md
def test_protocol_doc_is_the_generated_one():
    committed = (PROJECT_ROOT / "docs" / "PROTOCOL.md").read_text()
    assert committed == protocol_doc.render(), "run: python -m flcore.protocol_doc > docs/PROTOCOL.md"
