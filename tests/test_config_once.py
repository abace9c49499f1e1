"""The run config is parsed once at each entry point and passed down as the typed RunConfig (issue 34 item 2):
the out-dir is resolved in one place and every reader sees the same path, the result defaults are the
declaration's, the flat form (to_dict) is made only where the config leaves the process, a cross-section check
gets the parsed common section instead of parsing it again, and a misspelled key still names the key."""

from __future__ import annotations

import inspect
import json
from collections import Counter
from pathlib import Path

import pytest

import flcore.run_dir
from engines.local import run_local
from experiments.simulate import simulate
from flcore.common import CommonConfig
from flcore.config import ConfigError, RunConfig, resolve_run_config
from flcore.methods.fedprox import FedProxConfig
from flcore.methods.fedufo import FedUFOConfig
from server_app.preflight import check
from tests.test_architecture import CONFIG_WRITERS, ENTRY_POINTS

TINY = {"dataset": "digits", "model": "logistic", "num-server-rounds": 1, "checkpoint": False,
        "federated-eval-every": 0}


def _record_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Counter]:
    """Count RunConfig.from_dict / to_dict calls by the calling module, for the rest of the test."""
    calls: dict[str, Counter] = {"from_dict": Counter(), "to_dict": Counter()}
    from_dict, to_dict = RunConfig.from_dict.__func__, RunConfig.to_dict

    def caller() -> str:
        return inspect.currentframe().f_back.f_back.f_globals["__name__"]

    def counted_from_dict(cls, values, complete=False):
        calls["from_dict"][caller()] += 1
        return from_dict(cls, values, complete)

    def counted_to_dict(self):
        calls["to_dict"][caller()] += 1
        return to_dict(self)

    monkeypatch.setattr(RunConfig, "from_dict", classmethod(counted_from_dict))
    monkeypatch.setattr(RunConfig, "to_dict", counted_to_dict)
    return calls


def test_a_run_resolves_its_out_dir_once_and_every_reader_sees_that_path(tmp_path, monkeypatch):
    """out-dir '' under the working directory: the entry point (run_local) resolves it, the ServerApp's
    pre-flight, the runner and the results writer all read that path (runs/<method>-<time> made once)."""
    monkeypatch.chdir(tmp_path)
    made = []
    default_out_dir = flcore.run_dir.default_out_dir
    monkeypatch.setattr(flcore.run_dir, "default_out_dir", lambda *a, **k: made.append(a) or default_out_dir(*a, **k))
    seen = {}
    import server_app.app
    import server_app.runner

    real_check, real_run = server_app.app.check, server_app.runner.run_federation
    monkeypatch.setattr(server_app.app, "check", lambda *a, **k: seen.setdefault("preflight", real_check(*a, **k)))

    def run_federation(grid, cfg):
        seen["runner"] = cfg
        return real_run(grid, cfg)

    monkeypatch.setattr(server_app.app, "run_federation", run_federation)
    doc = run_local({**TINY, "method": "fedprox", "out-dir": ""}, 2)
    assert len(made) == 1 and made[0][0] == "fedprox"  # one resolution for the whole run
    run_dirs = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("fedprox-")]
    assert len(run_dirs) == 1
    out = str(run_dirs[0])
    assert seen["preflight"].out_dir == seen["runner"].out_dir == out
    assert seen["runner"].out_path == run_dirs[0] and (run_dirs[0] / "results.json").exists()
    written = json.loads((run_dirs[0] / "results.json").read_text())
    assert written["run_config"]["out-dir"] == doc["run_config"]["out-dir"] == out
    # the result default: the declaration's target-accuracy, nowhere repeated
    assert written["final"]["target_accuracy"] == CommonConfig.default_of("target-accuracy") == 0.8


def test_a_given_out_dir_and_target_reach_the_results_as_given(tmp_path, monkeypatch):
    """A relative out-dir from the command line's keys is made absolute once; a target-accuracy set there is
    the one results.json's final uses (not a default)."""
    monkeypatch.chdir(tmp_path)
    doc = simulate({**TINY, "out-dir": "here/run", "target-accuracy": 0.05}, num_supernodes=2)
    assert doc["run_config"]["out-dir"] == str(tmp_path / "here" / "run")
    assert doc["final"]["target_accuracy"] == 0.05 and doc["final"]["rounds_to_target"] == 1


def test_each_entry_point_parses_once_and_only_writers_flatten(tmp_path, monkeypatch):
    """A whole in-process run: RunConfig.from_dict is called once by each entry point (the caller's parse,
    the ServerApp's pre-flight, the ClientApp's first message) and nowhere else; to_dict only by the modules
    that hand the config out of the process (tests/test_architecture.py's CONFIG_WRITERS)."""
    import client_app.app

    monkeypatch.setattr(client_app.app, "_LAST_CONFIG", None)  # another test's config: this run's is parsed anew
    calls = _record_calls(monkeypatch)
    run_local({**TINY, "out-dir": str(tmp_path / "run")}, 2)
    assert dict(calls["from_dict"]) == {"engines.local": 1, "server_app.preflight": 1, "client_app.app": 1}
    assert set(calls["from_dict"]) <= set(ENTRY_POINTS)
    assert set(calls["to_dict"]) <= set(CONFIG_WRITERS), dict(calls["to_dict"])
    assert calls["to_dict"]["server_app.results"] == 1  # the echo, made once, also what the checkpoint records


def test_the_command_line_hands_its_parsed_config_on(tmp_path, monkeypatch):
    """`noniid-fl run`: the pre-flight parses, simulate() and run_local() take that object (no second parse on
    the caller's side)."""
    from cli.main import main

    import client_app.app

    monkeypatch.setattr(client_app.app, "_LAST_CONFIG", None)
    calls = _record_calls(monkeypatch)
    rc = main(["run", "-c", "dataset='digits'", "-c", "model='logistic'", "-c", "num-server-rounds=1",
               "-c", "checkpoint=false", "-c", f"out-dir='{tmp_path / 'cli'}'", "--nodes", "2"])
    assert rc == 0 and (tmp_path / "cli" / "results.json").exists()
    assert dict(calls["from_dict"]) == {"server_app.preflight": 2, "client_app.app": 1}  # CLI's, ServerApp's


def test_equal_configs_are_one_cache_key_and_sections_count(tmp_path):
    """RunConfig equality and hash cover every key, sections included (the client's data and model caches key
    on the config itself)."""
    a, b = RunConfig.from_dict({}), RunConfig.from_dict(resolve_run_config({}))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    mu = RunConfig.from_dict({"fedprox.mu": 0.5})
    assert mu != a and mu.section(FedProxConfig).mu == 0.5
    assert mu.replace(seed=3) != mu and mu.replace(seed=3).section(FedProxConfig).mu == 0.5


def test_replace_checks_each_value_and_the_cross_section_rule():
    cfg = RunConfig.from_dict({"fedufo.sampling-metric": "local-accuracy"})  # fedavg: the fedufo rule is idle
    assert cfg.replace(lr=0.1).lr == 0.1
    with pytest.raises(ConfigError, match="run-config key 'lr' got -1.0; allowed: > 0"):
        cfg.replace(lr=-1.0)
    with pytest.raises(ConfigError, match="unknown run-config key 'lrr'; did you mean 'lr'"):
        cfg.replace(lrr=0.1)
    with pytest.raises(ConfigError, match="'fedufo.sampling-metric' = 'local-accuracy'.*'local-test-fraction' is 0"):
        cfg.replace(method="fedufo")
    assert cfg.replace(method="fedufo", local_test_fraction=0.25).section(FedUFOConfig).sampling_metric == \
        "local-accuracy"
    with pytest.raises(ConfigError, match="run-config key 'method' got 'fedufoo'"):
        cfg.replace(method="fedufoo")


def test_the_cross_section_rule_gets_the_parsed_common_section(monkeypatch):
    """FedUFO's rule reads the common section handed to it (Section.check_run), never parsing it again."""
    seen = []
    monkeypatch.setattr(CommonConfig, "parse", classmethod(
        lambda cls, values, _p=CommonConfig.parse.__func__: seen.append(1) or _p(cls, values)))
    cfg = RunConfig.from_dict({"method": "fedufo", "local-test-fraction": 0.25,
                               "fedufo.sampling-metric": "global-model-local-accuracy"})
    assert len(seen) == 1 and cfg.section(FedUFOConfig).sampling_metric == "global-model-local-accuracy"


@pytest.mark.parametrize("where", ["from_dict", "simulate", "preflight", "value"])
def test_a_misspelled_key_names_the_key_on_every_path(where, tmp_path):
    with pytest.raises(ConfigError, match="unknown run-config key 'fedprox.muu'; did you mean 'fedprox.mu'"):
        if where == "from_dict":
            RunConfig.from_dict({"fedprox.muu": 0.1})
        elif where == "simulate":
            simulate({**TINY, "fedprox.muu": 0.1, "out-dir": str(tmp_path)}, num_supernodes=2)
        elif where == "preflight":
            check({"fedprox.muu": 0.1, "out-dir": str(tmp_path)})
        else:
            RunConfig.from_dict({}).value("fedprox.muu")


def test_value_reads_common_and_sectioned_keys():
    cfg = RunConfig.from_dict({"fedprox.mu": 0.25, "lr": 0.5, "fedbr.lambda": 0.3})
    assert (cfg.value("lr"), cfg.value("fedprox.mu"), cfg.value("fedbr.lambda")) == (0.5, 0.25, 0.3)
    assert cfg.value("num-server-rounds") == cfg.num_server_rounds == 10


def test_out_path_needs_a_resolved_out_dir(tmp_path):
    cfg = RunConfig.from_dict({"out-dir": str(tmp_path / "x")})
    assert cfg.with_out_dir() is cfg and cfg.out_path == (tmp_path / "x").resolve()
    assert Path(RunConfig.from_dict({"resume-from": str(tmp_path / "r" / "checkpoint.pt")}).with_out_dir()
                .out_dir) == tmp_path / "r"
