"""Paper presets: ``preset='<paper>-<setting>'`` sets every hyper-parameter a paper states for one of its settings.

A :class:`Preset` is a named set of run-config values (common and sectioned keys) with the paper it comes from
and, for each value the paper does not state, what we chose and why (``choices``). The table lives in
``flcore/paper_presets.py``; this module applies it.

Precedence (one rule on every path: ``noniid-fl run``, ``flwr run .``, the experiments runner, a client parsing
the run config): declared default < preset < a key set to a value *other than its declared default*. Flower
hands the ServerApp a complete run config (pyproject.toml's defaults merged with ``-c`` overrides), so a key
left at its default cannot be told from one set to the default on purpose: the preset's value wins there.
:func:`resolve_with_preset` (command line and experiments, which know the explicit overrides) refuses that one
ambiguous case instead of deciding it silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from flcore.schema import ConfigError, KeySpec, coerce


@dataclass(frozen=True)
class Preset:
    """One paper setting. ``values``: run-config key -> value, each one the paper states (cite in ``source``);
    ``choices``: key -> why we chose the value where the paper is silent (those keys are in ``values`` too)."""

    name: str
    paper: str
    setting: str
    source: str
    values: Mapping[str, Any]
    choices: Mapping[str, str] = field(default_factory=dict)
    num_supernodes: int = 0          # clients of the paper's federation (simulation nodes)
    scale: str = "paper"             # "paper": needs a torchvision data root / GPU-scale compute; "offline": runs here


def presets() -> dict[str, Preset]:
    """Every preset by name."""
    from flcore.paper_presets import PRESETS

    table: dict[str, Preset] = {}
    for p in PRESETS:
        if p.name in table:
            raise ValueError(f"preset '{p.name}' is declared twice")
        table[p.name] = p
    return table


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


def apply_preset(values: Mapping[str, Any], specs: Mapping[str, KeySpec]) -> dict[str, Any]:
    """``values`` with the named preset's values written over every key that is absent or at its declared
    default (the module docstring's rule). Without a preset, ``values`` unchanged."""
    name = str(values.get("preset", "") or "")
    if not name:
        return dict(values)
    preset = get_preset(name)
    out = dict(values)
    for key, value in preset.values.items():
        if key not in specs:
            raise ConfigError(f"preset '{name}' sets unknown run-config key '{key}' (a bug in flcore/paper_presets.py)")
        if key not in out or _at_default(key, out[key], specs[key]):
            out[key] = value
    return out


def resolve_with_preset(overrides: Mapping[str, Any], specs: Mapping[str, KeySpec]) -> None:
    """Refuse an explicit override that sets a preset key to the library default: the preset would win (see
    the module docstring), which is not what the user asked for."""
    name = str(overrides.get("preset", "") or "")
    if not name:
        return
    preset = get_preset(name)
    for key, value in overrides.items():
        if key in preset.values and key in specs and _at_default(key, value, specs[key]) \
                and coerce(key, preset.values[key], specs[key].type) != specs[key].default:
            raise ConfigError(f"run-config key '{key}' = {value!r} is the library default, and preset '{name}' "
                              f"sets it to {preset.values[key]!r}: a preset wins over default values, so this "
                              f"override would be ignored; drop the preset or choose another value")
