"""Paper presets: ``preset='<paper>-<setting>'`` sets every hyper-parameter a paper states for one of its settings.

A :class:`Preset` is a named set of run-config values (common and sectioned keys) with the paper it comes from
and, for each value the paper does not state, what we chose and why (``choices``). The table and its record type
live in ``flcore/paper_presets.py`` (which imports nothing of this module); this module applies it.

A method's own recipe (``MethodDecl.recipe``: a ``-code`` variant's optimizer, epochs and batch) is applied by the
same rule, under the preset: declared default < method recipe < preset < what the user sets.

Precedence: declared default < preset < what the user sets. Where the explicit overrides are known (``noniid-fl
run -c``, the experiments runner: :func:`flcore.config.resolve_run_config`) that rule is exact: the preset is
written over the defaults and the overrides over both, so ``method='fedavg'`` with a FedUFO preset runs FedAvg in
FedUFO's setting. Flower hands the ServerApp of ``flwr run .`` a complete run config (pyproject.toml's defaults
merged with ``-c`` overrides), where a key left at its default cannot be told from one set to the default on
purpose: there the preset fills every key still at its default value. Either way the result carries
``preset-applied = true``, so the preset is applied once and a client parsing the server's run config does not
apply it again.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flcore.paper_presets as paper_table
from flcore.paper_presets import Preset
from flcore.schema import ConfigError, KeySpec, coerce


def presets() -> dict[str, Preset]:
    """Every preset by name."""
    out: dict[str, Preset] = {}
    for p in paper_table.PRESETS:  # (read at each call: a test may add a preset to the table)
        if p.name in out:
            raise ValueError(f"preset '{p.name}' is declared twice")
        out[p.name] = p
    return out


def get_preset(name: str) -> Preset:
    table = presets()
    if name not in table:
        import difflib

        close = difflib.get_close_matches(name, list(table), n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"run-config key 'preset' got '{name}'{hint} (`noniid-fl methods` lists the presets: "
                          f"{', '.join(table)})")
    return table[name]


def _at_default(key: str, value: Any, spec: KeySpec) -> bool:
    try:
        return coerce(key, value, spec.type) == spec.default
    except ConfigError:
        return False


APPLIED = "preset-applied"


def _no_recipe(method: str) -> Mapping[str, Any]:
    return {}


def apply_preset(values: Mapping[str, Any], specs: Mapping[str, KeySpec],
                 explicit: Mapping[str, Any] | None = None,
                 recipe_of: Callable[[str], Mapping[str, Any]] = _no_recipe) -> dict[str, Any]:
    """``values`` with the named preset and the method's recipe applied (the module docstring's rule) and
    ``preset-applied`` set.

    ``explicit``: the overrides the user gave, when known: they are written over the preset. Otherwise the
    preset fills every key that is absent or at its declared default. Without a preset or a recipe, or once
    applied, ``values`` unchanged. ``recipe_of(method)``: the method's recipe (flcore/config.py passes the
    registry's; this module imports no declaration); the recipe is the one of the method the run ends with (a
    preset may set it)."""
    name = str(values.get("preset", "") or "")
    applied = values.get(APPLIED, False)
    if applied is True or str(applied).lower() == "true":
        return dict(values)
    preset_values = get_preset(name).values if name else {}
    for key in preset_values:
        if key not in specs:
            raise ConfigError(f"preset '{name}' sets unknown run-config key '{key}' (a bug in flcore/paper_presets.py)")
    method = _fill(values, preset_values, specs, explicit).get("method", _declared_method(specs))
    recipe = recipe_of(str(method))
    for key in recipe:
        if key not in specs:
            raise ConfigError(f"the recipe of method '{method}' sets unknown run-config key '{key}' (a bug in "
                              "its declaration)")
    if not preset_values and not recipe:
        return dict(values)
    out = _fill(values, {**recipe, **preset_values}, specs, explicit)
    out[APPLIED] = True
    return out


def _declared_method(specs: Mapping[str, KeySpec]) -> Any:
    spec = specs.get("method")
    return spec.default if spec is not None else None


def _fill(values: Mapping[str, Any], table: Mapping[str, Any], specs: Mapping[str, KeySpec],
          explicit: Mapping[str, Any] | None) -> dict[str, Any]:
    """``values`` with ``table`` written over every key the user did not set (the module docstring's rule)."""
    out = dict(values)
    for key, value in table.items():
        if explicit is not None:
            if key not in explicit:
                out[key] = value
        elif key not in out or _at_default(key, out[key], specs[key]):
            out[key] = value
    return out

