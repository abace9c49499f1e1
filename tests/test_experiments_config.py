"""Run configs outside the ServerApp: results recorded with the old flat keys (experiments/legacy.py), the
experiment runner's TOML tables with sectioned keys, and the deployment scripts' ``-c`` overrides."""

from __future__ import annotations

import json

import pytest

from deploy.localfed import _parse_overrides, run_config_toml
from experiments.legacy import current_run_config, renamed_keys
from experiments.run import load_experiment
from flcore.config import PROJECT_ROOT, ConfigError, RunConfig, all_specs
from flcore.methods.fedbc import FedBCConfig
from flcore.methods.fedprox import FedProxConfig
from flcore.methods.fedrane import FedRANEConfig
from flcore.methods.fedufo import FedUFOConfig

RESULTS = sorted((PROJECT_ROOT / "results").glob("*/*/seed*/results.json"))


def test_renamed_keys_come_from_the_declarations():
    renamed = renamed_keys()
    assert renamed["proximal-mu"] == "fedprox.mu" and renamed["server-lr"] == "scaffold.server-lr"
    assert renamed["fedbc-eta-lambda"] == "fedbc.eta-lambda" and renamed["lra-topk"] == "fedrane.lra-topk"
    assert renamed["fedufo-losses"] == "fedufo.losses" and renamed["fedbr-lambda"] == "fedbr.lambda"
    specs = all_specs()
    assert set(renamed.values()) <= set(specs)                       # every target is a current key
    assert not set(renamed) & set(specs)                             # no former name is still in use


def test_committed_results_read_under_current_names():
    """Every committed results.json (recorded with the old flat keys) translates to a run config that the
    current schema parses, with the recorded values in the new sections."""
    assert len(RESULTS) > 100
    for path in RESULTS:
        recorded = json.loads(path.read_text())["run_config"]
        current = current_run_config(recorded, str(path))
        assert len(current) == len(recorded)
        cfg = RunConfig.from_dict(current)
        assert cfg.method == recorded["method"] and cfg.num_server_rounds == recorded["num-server-rounds"]
    prox = json.loads((PROJECT_ROOT / "results/fedbc-table1-synthetic11/fedprox-e1/seed0/results.json").read_text())
    assert prox["run_config"]["proximal-mu"] == 1.0
    assert RunConfig.from_dict(current_run_config(prox["run_config"])).section(FedProxConfig).mu == 1.0
    rane = json.loads((PROJECT_ROOT / "results/fedrane-digits-dir01/fedrane/seed0/results.json").read_text())
    cfg = RunConfig.from_dict(current_run_config(rane["run_config"])).section(FedRANEConfig)
    assert (cfg.lra_topk, cfg.gne_scale) == (rane["run_config"]["lra-topk"], rane["run_config"]["gne-scale"])


def test_unknown_or_doubly_recorded_keys_are_errors_naming_them():
    with pytest.raises(ConfigError, match="results/x.json: key 'proximal-nu' is neither a current"):
        current_run_config({"method": "fedprox", "proximal-nu": 0.1}, "results/x.json")
    with pytest.raises(ConfigError, match="'fedprox.mu' is recorded twice"):
        current_run_config({"fedprox.mu": 0.1, "proximal-mu": 0.2})


def test_experiment_tables_with_sectioned_keys_merge_base_and_run(tmp_path):
    """``fedufo.losses = "cgl"`` in a TOML table is a nested table: a run's section keys must add to the
    base's keys of the same section, not replace them."""
    path = tmp_path / "exp.toml"
    path.write_text('[experiment]\nname = "t"\n[base]\ndataset = "digits"\nfedufo.num-clients = 7\n'
                    '[runs.cgl]\nmethod = "fedufo"\nfedufo.losses = "cgl"\n[runs.plain]\nmethod = "fedavg"\n')
    doc = load_experiment(path)
    assert doc["base"] == {"dataset": "digits", "fedufo.num-clients": 7}
    cfg = RunConfig.from_dict({**doc["base"], **doc["runs"]["cgl"]})
    assert cfg.section(FedUFOConfig).num_clients == 7 and cfg.section(FedUFOConfig).losses == {"cgl"}
    path.write_text('[experiment]\nname = "t"\n[runs.bad]\nmethod = "fedbc"\nfedbc.eta-lambda = -1.0\n')
    with pytest.raises(ConfigError, match=r"run 'bad': run-config key 'fedbc.eta-lambda' got -1.0"):
        load_experiment(path)


def test_every_committed_experiment_config_loads():
    configs = sorted((PROJECT_ROOT / "experiments/configs").glob("*.toml"))
    assert configs
    for path in configs:
        doc = load_experiment(path)
        for over in doc["runs"].values():
            assert all(not isinstance(v, dict) for v in {**doc["base"], **over}.values())


def test_deploy_overrides_keep_sectioned_keys_flat():
    over = _parse_overrides("method='fedbc' fedbc.eta-lambda=0.01 fedbc.fix-gamma=true num-server-rounds=3")
    assert over == {"method": "fedbc", "fedbc.eta-lambda": 0.01, "fedbc.fix-gamma": True, "num-server-rounds": 3}
    cfg = RunConfig.from_dict(over).section(FedBCConfig)
    assert cfg.eta_lambda == 0.01 and cfg.fix_gamma is True
    # the file handed to `flwr run -c` declares the same keys (Flower flattens its dotted keys back)
    assert run_config_toml(over).splitlines()[1] == "fedbc.eta-lambda = 0.01"
    assert _parse_overrides("") == {}
