"""Issue 31 item 9: a run that ends with the global model at chance while updates were rejected for NaN/Inf or
their norm says so in its last line, with the likely cause (server_app/diagnosis.py)."""

from __future__ import annotations

import numpy as np

from engines.grid import InProcessGrid
from flcore.config import RunConfig, resolve_run_config
from server_app.diagnosis import divergence_note, majority_share, rejection_counts
from server_app.runner import DONE_MARKER, run_federation

RUN = {"dataset": "digits", "model": "mlp", "num-server-rounds": 2, "checkpoint": False, "min-train-nodes": 6}


def _run(tmp_path, capsys, **over):
    cfg = RunConfig.from_dict(resolve_run_config({**RUN, **over, "out-dir": str(tmp_path / "r")}))
    doc = run_federation(InProcessGrid(6), cfg)
    lines = capsys.readouterr().out.strip().splitlines()
    return doc, lines


def test_a_diverged_run_says_so_in_its_last_line(tmp_path, capsys):
    """lr 1 with momentum 0.9 on digits' MLP: in round 2 half the local trainings blow up (norms in the
    thousands, rejected by max-update-norm) and the survivors leave a chance-level model."""
    doc, lines = _run(tmp_path, capsys, lr=1.0)
    nan, norm, sent, where = rejection_counts(doc["rounds"])
    acc = doc["rounds"][-1]["global_accuracy"]
    assert norm > 0 and sent == 12 and acc < 0.15  # it did diverge (10 classes)
    assert lines[-2].startswith(DONE_MARKER)
    last = lines[-1]
    assert last.startswith("WARNING: the global model ended at chance") and f"G-FL accuracy {acc:.4f}" in last
    assert f"{nan + norm} of {sent} client updates were rejected" in last and f"{norm} for their norm" in last
    assert "local training diverged" in last and "lr 1.0 (momentum 0.9) is too high" in last
    assert "model 'mlp' on 'digits'" in last and "try lr=0.1" in last


def test_a_run_that_learns_ends_with_the_done_line(tmp_path, capsys):
    doc, lines = _run(tmp_path, capsys)
    assert doc["rounds"][-1]["global_accuracy"] > 0.3
    assert lines[-1].startswith(DONE_MARKER) and not any("WARNING" in ln for ln in lines)


def _row(rnd: int, acc: float, reasons: list[str], sampled: int = 4) -> dict:
    return {"round": rnd, "global_accuracy": acc, "num_sampled": sampled,
            "failures": [{"cid": i, "phase": "train", "kind": "rejected", "reason": r} for i, r in enumerate(reasons)]}


CFG = RunConfig.from_dict({"lr": 0.5, "momentum": 0.0, "model": "convnet", "dataset": "fmnist"})


def test_the_note_needs_both_chance_and_nan_or_norm_rejections():
    nan = "tensor 'backbone.0.0.weight' contains NaN or Inf"
    norm = "update norm 57 exceeds update-norm-factor 10 x the round's median update norm (5.1)"
    rounds = [_row(1, 0.10, [nan, nan, norm]), _row(2, 0.10, [nan])]
    note = divergence_note(rounds, CFG, 0.10)
    assert "4 of 8 client updates were rejected (3 for NaN/Inf values, 1 for their norm; rounds 1-2)" in note
    assert "lr 0.5 (momentum 0.0) is too high for model 'convnet' on 'fmnist'; try lr=0.05" in note
    assert "(2 for NaN/Inf values, 1 for their norm; round 1)" in divergence_note(rounds[:1], CFG, 0.10)
    assert divergence_note([_row(1, 0.10, [])], CFG, 0.10) is None  # at chance, nothing rejected
    assert divergence_note([_row(1, 0.70, [nan])], CFG, 0.10) is None  # rejections, but it learned
    assert divergence_note([_row(1, 0.14, [nan])], CFG, 0.10) is not None  # below 1.5 x the constant guess
    assert divergence_note([_row(1, 0.16, [nan])], CFG, 0.10) is None
    assert divergence_note([_row(1, 0.10, [nan])], CFG, None) is None  # no global test set: nothing to judge
    other = ["reply claims num-examples=1000000000, but the client registered 50 training samples",
             "malformed reply: KeyError('metrics')"]
    assert divergence_note([_row(1, 0.10, other)], CFG, 0.10) is None  # other rejections are not divergence
    failed = {"round": 1, "global_accuracy": 0.1, "num_sampled": 2,
              "failures": [{"cid": 0, "phase": "train", "kind": "failed", "reason": "NaN or Inf in the loss"}]}
    assert divergence_note([failed], CFG, 0.10) is None  # only rejected updates count


def test_majority_share_of_the_test_labels():
    assert majority_share(None) is None and majority_share((np.zeros((0, 2)), np.zeros(0, np.int64))) is None
    assert majority_share((None, np.array([0, 1, 1, 2]))) == 0.5
