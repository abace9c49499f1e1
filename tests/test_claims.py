"""The claims ledger (experiments/claims.py): paired gains, verdicts, and the committed ledger's sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.claims import CLAIMS, Claim, Measured, ledger, load_claims, measure, verdict
from flcore.config import PROJECT_ROOT


def _write(root: Path, exp: str, label: str, accs: dict[int, float], rounds: int = 2) -> None:
    for seed, acc in accs.items():
        d = root / exp / label / f"seed{seed}"
        d.mkdir(parents=True)
        doc = {"run_config": {"num-server-rounds": rounds}, "rounds": [{}] * rounds, "final": {"global_accuracy": acc}}
        (d / "results.json").write_text(json.dumps(doc))


def test_gain_is_paired_by_seed_and_needs_three_seeds(tmp_path):
    c = Claim("x", "P", "c", "fig", 4.0, "e", "base", "meth")
    _write(tmp_path, "e", "base", {0: 0.80, 1: 0.70, 2: 0.90, 3: 0.5})
    _write(tmp_path, "e", "meth", {0: 0.82, 1: 0.73, 2: 0.91})  # seed 3 unpaired: left out
    m = measure(tmp_path, c)
    assert m.seeds == 3
    assert m.gain[0] == pytest.approx(2.0) and m.gain[1] == pytest.approx(0.8164966, rel=1e-6)
    assert m.baseline[0] == pytest.approx(80.0)
    _write(tmp_path, "e", "few", {0: 0.9, 1: 0.9})
    assert measure(tmp_path, Claim("y", "P", "c", "f", None, "e", "base", "few")) is None


def test_unfinished_runs_do_not_count(tmp_path):
    _write(tmp_path, "e", "base", {0: 0.8, 1: 0.8, 2: 0.8})
    _write(tmp_path, "e", "meth", {0: 0.9, 1: 0.9})
    d = tmp_path / "e" / "meth" / "seed2"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({"run_config": {"num-server-rounds": 5}, "rounds": [{}],
                                                "final": {"global_accuracy": 0.99}}))
    assert measure(tmp_path, Claim("x", "P", "c", "f", 1.0, "e", "base", "meth")) is None


@pytest.mark.parametrize("gain,std,paper,want", [
    (3.0, 1.0, 4.0, "reproduced"), (1.0, 0.5, 4.0, "partly"), (3.0, 4.0, 4.0, "partly"),
    (0.0, 0.1, 4.0, "not reproduced"), (-2.0, 1.0, 4.0, "not reproduced"), (0.5, 0.1, None, "reproduced")])
def test_verdict_rules(gain, std, paper, want):
    assert verdict(Measured(3, (0, 0), (0, 0), (gain, std)), paper) == want
    assert verdict(None, paper) == "not run"


def test_ledger_shows_reason_only_when_a_claim_fails(tmp_path):
    _write(tmp_path, "e", "base", {0: 0.8, 1: 0.8, 2: 0.8})
    _write(tmp_path, "e", "up", {0: 0.9, 1: 0.91, 2: 0.92})
    _write(tmp_path, "e", "down", {0: 0.7, 1: 0.7, 2: 0.7})
    text = ledger(tmp_path, [Claim("good", "P", "up", "f", 5.0, "e", "base", "up"),
                             Claim("bad", "P", "down", "f", 5.0, "e", "base", "down", reason="the cause")], {"e": "E"})
    assert "**reproduced**" in text and "**not reproduced**" in text
    assert "- **bad** (not reproduced): the cause" in text and "- **good**" not in text
    assert "+11.00 ± 0.82" in text


def test_committed_claims_name_declared_runs_of_committed_experiment_configs():
    import tomllib

    claims = load_claims(CLAIMS)
    assert {c.id for c in claims} >= {"fedrane", "gne", "fedbc", "fedbc-dual-weighting", "fedufo", "fedbr", "fedetf"}
    for c in claims:
        cfg = PROJECT_ROOT / "experiments" / "configs" / f"{c.experiment}.toml"
        runs = tomllib.loads(cfg.read_text())["runs"]
        assert c.baseline in runs and c.method in runs, c.id
        assert "tuning" in tomllib.loads(cfg.read_text()), f"{c.id}: a claim's experiment must be tuned"


def test_reason_numbers_come_from_the_result_files(tmp_path):
    for seed, vals in ((0, [0.5, 0.9]), (1, [0.7])):
        d = tmp_path / "e" / "m" / f"seed{seed}"
        d.mkdir(parents=True)
        rounds = [{"strategy": {"w-ratio": v}} for v in vals]
        (d / "results.json").write_text(json.dumps({"run_config": {}, "rounds": rounds, "final": {}}))
    from experiments.claims import fill_reason

    c = Claim("x", "P", "c", "f", 1.0, "e", "b", "m", reason="ratio {{m:w-ratio:median}} up to {{m:w-ratio:max}}; "
                                                             "{{m:nothing:max}}")
    assert fill_reason(tmp_path, c) == "ratio 0.7 up to 0.9; (no 'nothing' recorded for m)"
