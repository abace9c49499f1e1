"""Typed run-config sections whose fields declare their default, bounds and doc once.

A section is a frozen dataclass subclassing :class:`Section`; each field is made with :func:`param`::

    @dataclass(frozen=True)
    class FedProxConfig(Section):
        NAME = "fedprox"
        mu: float = param(0.01, "mu of the proximal term mu/2 ||w - w^t||^2 (FedProx Eq. 2)", ge=0)

Keys are kebab-case and prefixed by the section's table, the way Flower flattens nested tables:
``[tool.flwr.app.config.fedprox] mu = 0.01`` is the key ``fedprox.mu``; the common section (``NAME = ""``)
has flat keys. :meth:`Section.parse` coerces the types and checks every declared bound, so no check is
written by hand; cross-field constraints go in :meth:`Section.check`. Floats must always be finite.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping, Protocol, TypeVar

S = TypeVar("S", bound="Section")


class ConfigError(ValueError):
    """A run-config value is missing, unknown, of the wrong type or out of range."""


def param(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
          le: float | None = None, lt: float | None = None, choices: tuple[str, ...] | None = None,
          old: str | None = None) -> Any:
    """A config field: ``default``, a one-line ``doc`` (cite the paper's equation), bounds (``ge``/``gt``/
    ``le``/``lt`` for numbers, ``choices`` for strings) and the flat key it had before sectioning (``old``)."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "old": old}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class KeySpec:
    """One run-config key as declared: what ``noniid-fl config`` lists and pyproject.toml is generated from."""

    key: str
    type: str
    default: Any
    doc: str
    allowed: str
    old: str | None


def type_name(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else f.type.__name__


def _allowed(meta: Mapping[str, Any], typ: str) -> str:
    if meta.get("choices"):
        return "one of " + ", ".join(meta["choices"])
    parts = [f"{op} {meta[name]}" for name, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
             if meta.get(name) is not None]
    if typ == "float":
        parts.append("finite")
    return ", ".join(parts) or f"any {typ}"


def coerce(key: str, value: Any, typ: str) -> Any:
    """``value`` as a ``typ`` (bool/int/float/str), or ConfigError naming the key."""
    ok: Any = None
    if typ == "bool":
        if isinstance(value, bool):
            ok = value
        elif isinstance(value, str) and value.lower() in ("true", "false"):
            ok = value.lower() == "true"
    elif typ == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            ok = value
        elif isinstance(value, float) and value.is_integer():
            ok = int(value)
    elif typ == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            ok = float(value)
    elif typ == "str":
        if isinstance(value, str):
            ok = value
    else:
        raise TypeError(f"config field type {typ!r} is not supported (bool, int, float, str)")
    if ok is None:
        raise ConfigError(f"run-config key '{key}' must be a {typ}, got {value!r}")
    return ok


def check_bounds(key: str, value: Any, meta: Mapping[str, Any], typ: str) -> None:
    """ConfigError naming the key, the bad value and what is allowed, when ``value`` breaks a bound."""
    bad = False
    if typ == "float" and not math.isfinite(value):
        bad = True
    elif typ in ("int", "float"):
        bad = ((meta.get("ge") is not None and not value >= meta["ge"])
               or (meta.get("gt") is not None and not value > meta["gt"])
               or (meta.get("le") is not None and not value <= meta["le"])
               or (meta.get("lt") is not None and not value < meta["lt"]))
    elif typ == "str" and meta.get("choices") is not None:  # a choice ending in '*' allows that prefix + more
        bad = not any(value == c or (c.endswith("*") and value.startswith(c[:-1]) and len(value) > len(c) - 1)
                      for c in meta["choices"])
    if bad:
        raise ConfigError(f"run-config key '{key}' got {value!r}; allowed: {_allowed(meta, typ)}")


@dataclass(frozen=True)
class DeclaredField:
    """One field of a section as parse() and specs() read it: attribute name, run-config key, type, default and
    the bounds and doc of :func:`param`."""

    name: str
    key: str
    type: str
    default: Any
    meta: Mapping[str, Any]


_DECLARED: dict[type, tuple[DeclaredField, ...]] = {}


def declared_fields(cls: type[Section]) -> tuple[DeclaredField, ...]:
    """The fields of section class ``cls``, worked out once per class (a class's fields never change): parsing a
    run config walks about 90 sections, and every run and message parses one."""
    found = _DECLARED.get(cls)
    if found is None:
        found = _DECLARED[cls] = tuple(DeclaredField(f.name, cls.key_of(f.name), type_name(f), f.default, f.metadata)
                                       for f in fields(cls))
    return found


@dataclass(frozen=True)
class Section:
    """Base of every config section; ``NAME`` is its table ("" = the flat common keys)."""

    NAME: ClassVar[str] = ""

    @classmethod
    def key_of(cls, field_name: str) -> str:
        kebab = field_name.rstrip("_").replace("_", "-")  # lambda_ -> "lambda"
        return f"{cls.NAME}.{kebab}" if cls.NAME else kebab

    @classmethod
    def specs(cls) -> list[KeySpec]:
        return [KeySpec(d.key, d.type, d.default, d.meta.get("doc", ""), _allowed(d.meta, d.type), d.meta.get("old"))
                for d in declared_fields(cls)]

    @classmethod
    def parse(cls: type[S], values: Mapping[str, Any]) -> S:
        """The section from a flat run-config mapping; absent keys take their declared default."""
        kwargs = {}
        for d in declared_fields(cls):
            value = coerce(d.key, values[d.key], d.type) if d.key in values else d.default
            check_bounds(d.key, value, d.meta, d.type)
            kwargs[d.name] = value
        obj = cls(**kwargs)
        obj.check()
        return obj

    @classmethod
    def default_of(cls, key: str) -> Any:
        """The declared default of this section's ``key`` (e.g. ``CommonConfig.default_of("target-accuracy")``)."""
        for f in fields(cls):
            if cls.key_of(f.name) == key:
                return f.default
        raise KeyError(f"section '{cls.NAME or 'common'}' declares no key '{key}'")

    def check(self) -> None:
        """Cross-field constraints (raise ConfigError naming the keys); bounds are checked by parse()."""

    def check_run(self, common: "Section") -> None:
        """Constraints between this section and the common keys (``common``: the parsed common section,
        flcore/common.py), checked once the whole run config is parsed and only when this section's method is
        the one that runs; raise ConfigError naming the keys. No section parses another: it is handed over."""

    def to_dict(self) -> dict[str, Any]:
        return {d.key: getattr(self, d.name) for d in declared_fields(type(self))}

    def replace(self: S, **changes: Any) -> S:
        return dataclasses.replace(self, **changes)


class Sectioned(Protocol):
    """What a declaration's hooks see of the parsed run config (flcore.config.RunConfig): its sections. A
    declaration module types its hooks with it instead of importing flcore.config, which imports the
    declarations (through the registry)."""

    def section(self, cls: type[S]) -> S: ...

    @property
    def method_section(self) -> Section | None: ...
