"""The run config: the common keys (flat) and every method's section (``<method>.<key>``), parsed once.

Flower hands the run config over as a flat ``dict`` (``[tool.flwr.app.config]`` of pyproject.toml, nested
tables flattened to dotted keys, overridden with ``-c "key=value"``). :meth:`RunConfig.from_dict` turns it
into typed, validated values *before any engine or round starts*: unknown keys are refused with the closest
known key (or the new name of a renamed one), every value is checked against the bounds declared on its
field (flcore/schema.py), and each method's section is parsed from the registry's declarations.
The declarations are the only home of the defaults: pyproject.toml's tables are generated from them
(``python -m flcore.pyproject``), and a test checks that the two agree.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, TypeVar

from flcore.common import DATASETS, DEVICES, ENGINES, HEADS, MODELS, PARTITIONS, CommonConfig
from flcore.presets import apply_preset
from flcore.schema import ConfigError, KeySpec, Section, check_bounds, coerce

__all__ = ["ConfigError", "CommonConfig", "RunConfig", "resolve_run_config", "all_specs", "DATASETS", "PARTITIONS", "MODELS",
           "HEADS", "DEVICES", "ENGINES"]

S = TypeVar("S", bound=Section)


def section_classes() -> list[type[Section]]:
    """The common section, then every registered method's section."""
    from flcore.registry import sections

    return [CommonConfig, *sections()]


def all_specs() -> dict[str, KeySpec]:
    """Every run-config key, as declared (common keys first)."""
    return {s.key: s for cls in section_classes() for s in cls.specs()}


def _unknown_key_error(key: str, known: Mapping[str, KeySpec]) -> ConfigError:
    renamed = {s.old: s.key for s in known.values() if s.old}
    if key in renamed:
        return ConfigError(f"run-config key '{key}' was renamed to '{renamed[key]}' (method keys are sectioned: "
                           f"see the README's migration note)")
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "; `noniid-fl config` lists every key"
    return ConfigError(f"unknown run-config key '{key}'{hint}")


@dataclass(frozen=True)
class RunConfig(CommonConfig):
    """The parsed run config: the common keys as attributes, each method section via :meth:`section`."""

    sections: Mapping[str, Section] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], complete: bool = False) -> "RunConfig":
        """Parse and validate a flat run config; absent keys take their declared defaults, unless
        ``complete`` (a client parsing the run config its server sent: every key must be there)."""
        known = all_specs()
        for key in values:
            if key not in known:
                raise _unknown_key_error(key, known)
        values = apply_preset(values, known)
        if complete:
            missing = [k for k in known if k not in values]
            if missing:
                raise ConfigError(f"the run config received lacks key(s) {', '.join(missing[:5])}: the sender "
                                  "runs another version of this project")
        common = CommonConfig.parse(values)
        parsed = {c.NAME: c.parse(values) for c in section_classes()[1:]}
        kwargs = {f.name: getattr(common, f.name) for f in fields(CommonConfig)}
        return cls(**kwargs, sections=parsed)

    def section(self, cls: type[S]) -> S:
        """The parsed section ``cls`` (e.g. ``cfg.section(FedProxConfig).mu``)."""
        try:
            found = self.sections[cls.NAME]
        except KeyError:
            raise ConfigError(f"config section '{cls.NAME}' is not registered (no method declares it)") from None
        if not isinstance(found, cls):
            raise TypeError(f"section '{cls.NAME}' is a {type(found).__name__}, not a {cls.__name__}")
        return found

    def to_dict(self) -> dict[str, Any]:
        """Every key (common and sectioned), what results.json records and messages carry."""
        out = {CommonConfig.key_of(f.name): getattr(self, f.name) for f in fields(CommonConfig)}
        for sec in self.sections.values():
            out.update(sec.to_dict())
        return out

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with common fields changed (validated again)."""
        values = self.to_dict()
        values.update({CommonConfig.key_of(k): v for k, v in changes.items()})
        return RunConfig.from_dict(values)


def defaults() -> dict[str, Any]:
    """Every key with its declared default."""
    return {key: spec.default for key, spec in all_specs().items()}


def resolve_run_config(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The declared defaults updated with ``overrides``; an unknown key is an error naming the closest one."""
    values = defaults()
    known = all_specs()
    for key, value in (overrides or {}).items():
        if key not in known:
            raise _unknown_key_error(key, known)
        values[key] = value
    return apply_preset(values, known, explicit=overrides or {})


PROJECT_ROOT = Path(__file__).resolve().parent.parent


def check_value(key: str, value: Any) -> Any:
    """Coerce and bound-check one value of a known key (the CLI uses it for single overrides)."""
    known = all_specs()
    if key not in known:
        raise _unknown_key_error(key, known)
    spec = known[key]
    sec = next(c for c in section_classes() if any(s.key == key for s in c.specs()))
    f = next(f for f in fields(sec) if sec.key_of(f.name) == key)
    out = coerce(key, value, spec.type)
    check_bounds(key, out, f.metadata, spec.type)
    return out

