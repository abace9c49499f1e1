"""Read run configs recorded before the method keys were sectioned (issue 16).

The results.json files under results/ record their run config with the old flat keys (``proximal-mu``,
``fedbc-eta-lambda``, ``lra-topk`` ...). Every renamed field declares its former key (``param(..., old=)``,
flcore/schema.py), so the translation is built from the declarations, not written by hand.
"""

from __future__ import annotations

from typing import Any, Mapping

from flcore.config import ConfigError, all_specs


# (current key, former value) -> current value, for choices renamed since results were recorded
RENAMED_VALUES: dict[tuple[str, Any], Any] = {
    ("fedrane.lra-eval", "relational"): "transductive",  # the graph spans the evaluation batch (issue 19)
}


def renamed_keys() -> dict[str, str]:
    """Former flat key -> current key, for every declared field that was renamed."""
    return {spec.old: spec.key for spec in all_specs().values() if spec.old}


def current_run_config(recorded: Mapping[str, Any], source: str = "run config") -> dict[str, Any]:
    """``recorded`` with every former key replaced by its current name (current keys are kept as they are).

    A key that is neither current nor a declared former name, or a value recorded under both names, is a
    ConfigError naming the key and ``source`` (e.g. the results.json path)."""
    known = all_specs()
    renamed = renamed_keys()
    out: dict[str, Any] = {}
    for key, value in recorded.items():
        new = key if key in known else renamed.get(key)
        if new is None:
            raise ConfigError(f"{source}: key '{key}' is neither a current run-config key nor a former name "
                              "of one (see the `old=` of the declarations in flcore/methods/)")
        if new in out:
            raise ConfigError(f"{source}: '{new}' is recorded twice (as '{key}' and under its other name)")
        out[new] = RENAMED_VALUES.get((new, value), value)
    return out
