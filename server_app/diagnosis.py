"""What a finished run's last line adds when the run did not learn (issue 31 item 9).

A run whose global model ends at chance while clients' updates were rejected for NaN/Inf values or for
their norm has almost always diverged in local training: the step size is too large for the model (the
symptom the FMNIST preset with lr 0.5 showed: 14 of 20 updates NaN, G-FL 0.10). The line says so, with the
counts and the likely cause, instead of a bare "final G-FL accuracy 0.1".
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from flcore.config import RunConfig

CHANCE_MARGIN = 1.5  # "at chance": below this multiple of always predicting the test set's commonest class
_NAN, _NORM = "NaN or Inf", ("exceeds max-update-norm", "exceeds update-norm-factor")


def majority_share(test_set: tuple[Any, Any] | None) -> float | None:
    """The share of the commonest label in ``(x, y)`` (y: a tensor or array of class ids), None without one."""
    if test_set is None or len(test_set[1]) == 0:
        return None
    counts = np.bincount(np.asarray(test_set[1].cpu() if hasattr(test_set[1], "cpu") else test_set[1]))
    return float(counts.max() / counts.sum())


def rejection_counts(rounds: Sequence[Mapping[str, Any]]) -> tuple[int, int, int, list[int]]:
    """(updates rejected for NaN/Inf values, for their norm, updates sent, rounds with such a rejection)."""
    nan = norm = sent = 0
    where = []
    for row in rounds:
        sent += int(row.get("num_sampled") or 0)
        hit = False
        for f in row.get("failures", []):
            reason = str(f.get("reason", ""))
            if f.get("kind") != "rejected":
                continue
            if _NAN in reason:
                nan += 1
                hit = True
            elif any(s in reason for s in _NORM):
                norm += 1
                hit = True
        if hit:
            where.append(int(row.get("round", 0)))
    return nan, norm, sent, where


def divergence_note(rounds: Sequence[Mapping[str, Any]], cfg: RunConfig, majority_share: float | None) -> str | None:
    """The warning for a run that ended at chance after NaN/norm rejections, or None.

    ``majority_share``: the share of the global test set's commonest class (what a constant prediction
    scores); None when the run evaluated no global test set (nothing to judge)."""
    if not rounds or majority_share is None:
        return None
    acc = rounds[-1].get("global_accuracy")
    if acc is None or acc >= CHANCE_MARGIN * majority_share:
        return None
    nan, norm, sent, where = rejection_counts(rounds)
    if nan + norm == 0:
        return None
    kinds = ", ".join(s for s in (f"{nan} for NaN/Inf values" if nan else "",
                                  f"{norm} for their norm" if norm else "") if s)
    lr, momentum = cfg.lr, cfg.momentum
    smaller = f"{lr / 10:g}"
    span = f"round {where[0]}" if len(where) == 1 else f"rounds {where[0]}-{where[-1]}"
    return (f"WARNING: the global model ended at chance (G-FL accuracy {acc:.4f}; always predicting the "
            f"commonest class scores {majority_share:.4f}) and {nan + norm} of {sent} client updates were "
            f"rejected ({kinds}; {span}): local training diverged. Likely cause: lr {lr} (momentum "
            f"{momentum}) is too high for model '{cfg.model}' on '{cfg.dataset}'; "
            f"try lr={smaller} (the rejections are in results.json's failures)")
