"""Issue 19: the shipped defaults are a strong, fair baseline, and presets apply over them by one rule."""

from __future__ import annotations

import pytest

from flcore.config import ConfigError, RunConfig, defaults, resolve_run_config
from flcore.presets import Preset, apply_preset


def test_the_default_optimizer_is_the_papers_and_nothing_is_carved_out_silently():
    cfg = RunConfig.from_dict(defaults())
    assert (cfg.momentum, cfg.weight_decay, cfg.lr) == (0.9, 5e-4, 0.03)
    assert cfg.local_test_fraction == 0.0 and cfg.validation_fraction == 0.0 and cfg.federated_eval_every == 0
    with pytest.raises(ConfigError, match="federated-eval-every.*local-test-fraction"):
        RunConfig.from_dict(resolve_run_config({"federated-eval-every": 1}))


def test_preset_values_fill_defaults_and_lose_to_explicit_non_default_values(monkeypatch):
    import flcore.paper_presets as table

    p = Preset("demo-x", "paper", "setting", "Sec. 1", {"lr": 0.2, "local-epochs": 5, "fedprox.mu": 0.5})
    monkeypatch.setattr(table, "PRESETS", [*table.PRESETS, p])
    cfg = RunConfig.from_dict(resolve_run_config({"preset": "demo-x", "local-epochs": 3}))
    assert (cfg.lr, cfg.local_epochs) == (0.2, 3)  # preset fills the default, the explicit 3 wins
    assert cfg.to_dict()["fedprox.mu"] == 0.5
    # Flower's complete run config (pyproject defaults + overrides): the same rule, key by key
    flat = {**defaults(), "preset": "demo-x", "local-epochs": 3}
    assert RunConfig.from_dict(flat).to_dict() == cfg.to_dict()
    # where the explicit keys are known, an explicit library default wins too; in Flower's complete run
    # config it cannot be told from an unset key, and the preset fills it
    assert RunConfig.from_dict(resolve_run_config({"preset": "demo-x", "local-epochs": 1})).local_epochs == 1
    assert RunConfig.from_dict({**defaults(), "preset": "demo-x", "local-epochs": 1}).local_epochs == 5
    # applied once: a client parsing the server's (complete, applied) run config keeps it as it is
    sent = RunConfig.from_dict(resolve_run_config({"preset": "demo-x", "local-epochs": 1})).to_dict()
    assert sent["preset-applied"] is True and RunConfig.from_dict(sent, complete=True).local_epochs == 1
    assert apply_preset({"lr": 0.01}, {}) == {"lr": 0.01}  # no preset: unchanged


@pytest.mark.slow
def test_fedavg_with_every_default_reaches_90_percent_on_mnist5k(tmp_path):
    """The issue's bar: `noniid-fl run --nodes 10` with nothing set (mnist-5k, Dirichlet(0.5), 5 rounds)."""
    from experiments.simulate import simulate

    doc = simulate({"num-server-rounds": 5, "out-dir": str(tmp_path), "checkpoint": False}, num_supernodes=10)
    rc = doc["run_config"]
    assert (rc["method"], rc["dataset"], rc["partition"], rc["dirichlet-alpha"]) == ("fedavg", "mnist-5k", "dirichlet", 0.5)
    assert doc["final"]["global_accuracy"] >= 0.90
    assert sum(int(r["num_updates"]) for r in doc["rounds"][:1]) == 10


def test_run_without_nodes_uses_the_presets_federation_size(capsys):
    from cli.main import main

    assert main(["run", "--check", "-c", "preset='fedbc-synthetic-e1'"]) == 0
    assert "fedbc on synthetic, 30 nodes" in capsys.readouterr().out
    assert main(["run", "--check", "--nodes", "12", "-c", "preset='fedbc-synthetic-e1'"]) == 0
    assert ", 12 nodes" in capsys.readouterr().out
    assert main(["run", "--check"]) == 0
    assert "fedavg on mnist-5k, 10 nodes" in capsys.readouterr().out


def test_a_methods_recipe_fills_common_defaults_under_the_preset_and_the_user():
    """MethodDecl.recipe (a -code variant's optimizer, epochs, batch): declared default < recipe < preset < user,
    recorded in the run config, applied once (a client re-parsing the server's config keeps it)."""
    import flcore.paper_presets as table
    from flcore.registry import FEDAVG_STRATEGY, BASE_TRAINER, MethodDecl, register, unregister

    decl = MethodDecl("demo-recipe", "paper", FEDAVG_STRATEGY, BASE_TRAINER,
                      recipe={"lr": 0.1, "local-epochs": 10, "batch-size": 128},
                      recipe_sources={"lr": "a.py f", "local-epochs": "a.py f", "batch-size": "a.py g"})
    register(decl)
    try:
        cfg = RunConfig.from_dict(resolve_run_config({"method": "demo-recipe"}))
        assert (cfg.lr, cfg.local_epochs, cfg.batch_size) == (0.1, 10, 128)
        assert cfg.to_dict()["preset-applied"] is True
        assert RunConfig.from_dict(cfg.to_dict(), complete=True).to_dict() == cfg.to_dict()
        user = RunConfig.from_dict(resolve_run_config({"method": "demo-recipe", "lr": 0.03}))
        assert (user.lr, user.local_epochs) == (0.03, 10)  # an explicit value wins, even the library default
        flat = RunConfig.from_dict({**defaults(), "method": "demo-recipe"})  # Flower's complete run config
        assert (flat.lr, flat.batch_size) == (0.1, 128)
        other = RunConfig.from_dict(resolve_run_config({"method": "fedavg"}))
        assert (other.lr, other.local_epochs) == (0.03, 1) and other.to_dict()["preset-applied"] is False
        p = Preset("demo-r", "paper", "setting", "Sec. 1", {"lr": 0.5, "method": "demo-recipe"})
        import pytest as _pytest
        mp = _pytest.MonkeyPatch()
        mp.setattr(table, "PRESETS", [*table.PRESETS, p])
        try:  # the preset's method brings its recipe; the preset's own lr wins over the recipe's
            pre = RunConfig.from_dict(resolve_run_config({"preset": "demo-r"}))
            assert (pre.method, pre.lr, pre.local_epochs) == ("demo-recipe", 0.5, 10)
        finally:
            mp.undo()
        with pytest.raises(ValueError, match="recipe key.*batch-size.*no source"):
            MethodDecl("x", "p", FEDAVG_STRATEGY, BASE_TRAINER, recipe={"batch-size": 8})
    finally:
        unregister("demo-recipe")


def test_config_listing_shows_a_methods_recipe_with_its_sources():
    from cli.listing import config_text
    from flcore.registry import FEDAVG_STRATEGY, BASE_TRAINER, MethodDecl, register, unregister

    register(MethodDecl("demo-recipe2", "paper", FEDAVG_STRATEGY, BASE_TRAINER, recipe={"lr": 0.1},
                        recipe_sources={"lr": "main.py --lr"}))
    try:
        text = config_text("demo-recipe2")
        assert "demo-recipe2's recipe" in text and "  lr = 0.1  (main.py --lr)" in text
    finally:
        unregister("demo-recipe2")
