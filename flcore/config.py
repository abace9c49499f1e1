"""The run config: the common keys (flat) and every method's section (``<method>.<key>``), parsed once.

Flower hands the run config over as a flat ``dict`` (``[tool.flwr.app.config]`` of pyproject.toml, nested
tables flattened to dotted keys, overridden with ``-c "key=value"``). :meth:`RunConfig.from_dict` turns it
into typed, validated values *before any engine or round starts*: unknown keys are refused with the closest
known key (or the new name of a renamed one), every value is checked against the bounds declared on its
field (flcore/schema.py), and each method's section is parsed from the registry's declarations.
The declarations are the only home of the defaults: pyproject.toml's tables are generated from them
(``python -m flcore.pyproject``), and a test checks that the two agree.

Parsed once, passed down: each entry point (the ServerApp's main, the ClientApp per run config received, the
command line, ``simulate``/``run_local``, the experiment runner, the benchmarks) parses the flat values once and
hands the :class:`RunConfig` on; what is derived from it (the resolved out-dir: :meth:`RunConfig.with_out_dir`;
the result defaults: the declared ``target-accuracy``) is worked out here, not again downstream.
:meth:`RunConfig.to_dict` is the flat form for what leaves the process (Flower's run config, the messages'
"run_config" record, results.json and the checkpoint): tests/test_architecture.py keeps it there.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, TypeVar

from flcore.common import DATASETS, DEVICES, ENGINES, HEADS, MODELS, PARTITIONS, CommonConfig
from flcore.presets import apply_preset
from flcore.run_dir import resolve_out_dir
from flcore.schema import ConfigError, KeySpec, Section, type_name, check_bounds, coerce

__all__ = ["ConfigError", "CommonConfig", "RunConfig", "resolve_run_config", "all_specs", "DATASETS", "PARTITIONS", "MODELS",
           "HEADS", "DEVICES", "ENGINES"]

S = TypeVar("S", bound=Section)


def section_classes() -> list[type[Section]]:
    """The common section, then every registered method's section."""
    from flcore.registry import sections

    return [CommonConfig, *sections()]


def all_specs() -> Mapping[str, KeySpec]:
    """Every run-config key, as declared (common keys first); read-only, worked out once per set of sections."""
    return _specs_of(tuple(section_classes()))


@functools.lru_cache(maxsize=4)
def _specs_of(classes: tuple[type[Section], ...]) -> Mapping[str, KeySpec]:
    return MappingProxyType({s.key: s for cls in classes for s in cls.specs()})


def _unknown_key_error(key: str, known: Mapping[str, KeySpec]) -> ConfigError:
    renamed = {s.old: s.key for s in known.values() if s.old}
    if key in renamed:
        return ConfigError(f"run-config key '{key}' was renamed to '{renamed[key]}' (method keys are sectioned: "
                           f"see the README's migration note)")
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "; `noniid-fl config` lists every key"
    return ConfigError(f"unknown run-config key '{key}'{hint}")


@dataclass(frozen=True, eq=False)
class RunConfig(CommonConfig):
    """The parsed run config: the common keys as attributes, each method section via :meth:`section`.

    Two configs are equal when every key (common and sectioned) has the same value; the hash is computed once
    per object, so a config is itself the key of the caches that depend on it (a client's data, its models)."""

    sections: Mapping[str, Section] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], complete: bool = False) -> "RunConfig":
        """Parse and validate a flat run config; absent keys take their declared defaults, unless
        ``complete`` (a client parsing the run config its server sent: every key must be there)."""
        known = all_specs()
        for key in values:
            if key not in known:
                raise _unknown_key_error(key, known)
        values = apply_preset(values, known, recipe_of=method_recipe)
        if complete:
            missing = [k for k in known if k not in values]
            if missing:
                raise ConfigError(f"the run config received lacks key(s) {', '.join(missing[:5])}: the sender "
                                  "runs another version of this project")
        common = CommonConfig.parse(values)
        _check_method(common.method)
        parsed = {c.NAME: c.parse(values) for c in section_classes()[1:]}
        kwargs = {f.name: getattr(common, f.name) for f in fields(CommonConfig)}
        cfg = cls(**kwargs, sections=parsed)
        cfg._check_run()
        return cfg

    def _check_run(self) -> None:
        """The running method's section against the common keys (Section.check_run)."""
        own = self.method_section
        if own is not None:
            own.check_run(self)
        from flcore.registry import get_method

        refusal = get_method(self.method).precision_refusal(self.precision)
        if refusal:
            raise ConfigError(f"run-config: {refusal}")

    @property
    def method_section(self) -> Section | None:
        """The running method's own section (its declaration's ``config``), or None for a method without one."""
        from flcore.registry import get_method

        own = get_method(self.method).config
        return None if own is None else self.section(own)

    def section(self, cls: type[S]) -> S:
        """The parsed section ``cls`` (e.g. ``cfg.section(FedProxConfig).mu``)."""
        try:
            found = self.sections[cls.NAME]
        except KeyError:
            raise ConfigError(f"config section '{cls.NAME}' is not registered (no method declares it)") from None
        if not isinstance(found, cls):
            raise TypeError(f"section '{cls.NAME}' is a {type(found).__name__}, not a {cls.__name__}")
        return found

    def value(self, key: str) -> Any:
        """The parsed value of one flat key (``"lr"``, ``"fedprox.mu"``): for code that names keys as data (a
        table's columns, a sweep's axes), without flattening the whole config."""
        name, dot, _ = key.rpartition(".")
        sec: Any = self.sections.get(name) if dot else self
        cls = type(sec) if dot else CommonConfig
        for f in (fields(cls) if sec is not None else ()):
            if cls.key_of(f.name) == key:
                return getattr(sec, f.name)
        raise _unknown_key_error(key, all_specs())

    def to_dict(self) -> dict[str, Any]:
        """Every key (common and sectioned), flat: what leaves the process (Flower's run config, messages,
        results.json, checkpoints). Not for reading a value back: use the attribute or :meth:`section`."""
        out = {CommonConfig.key_of(f.name): getattr(self, f.name) for f in fields(CommonConfig)}
        for sec in self.sections.values():
            out.update(sec.to_dict())
        return out

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with common fields changed (``out_dir=...``), each value checked against its declaration and
        the cross-field constraints checked again; the sections are kept as parsed."""
        by_name = {f.name: f for f in fields(CommonConfig)}
        checked = {}
        for name, value in changes.items():
            key = CommonConfig.key_of(name)
            if name not in by_name:
                raise _unknown_key_error(key, all_specs())
            typ = type_name(by_name[name])
            checked[name] = coerce(key, value, typ)
            check_bounds(key, checked[name], by_name[name].metadata, typ)
        out = dataclasses.replace(self, **checked)
        CommonConfig.check(out)
        _check_method(out.method)
        out._check_run()
        return out

    def with_out_dir(self) -> "RunConfig":
        """This config with ``out-dir`` resolved (flcore/run_dir.py: '' -> runs/<method>-<timestamp>, or the
        resumed run's directory; absolute). The one place it is worked out: an entry point calls it once and
        passes the result on; a resolved config comes back as it is."""
        resolved = str(resolve_out_dir(self.out_dir, self.resume_from, self.method))
        return self if resolved == self.out_dir else dataclasses.replace(self, out_dir=resolved)

    @property
    def out_path(self) -> Path:
        """The resolved out-dir as a path (symbolic links resolved); ConfigError if it was never resolved."""
        if not self.out_dir:
            raise ConfigError("run-config key 'out-dir' is '' here: the entry point resolves it once "
                              "(RunConfig.with_out_dir) and passes the resolved config on")
        return Path(self.out_dir).expanduser().resolve()

    @functools.cached_property
    def _values(self) -> tuple:
        return (tuple(getattr(self, f.name) for f in fields(CommonConfig)), tuple(self.sections.items()))

    @functools.cached_property
    def _hash(self) -> int:
        return hash(self._values)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, RunConfig):
            return NotImplemented
        return self._hash == other._hash and self._values == other._values

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the memoized hash: str hashes differ between processes (PoolGrid workers, Ray)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_values", "_hash")}


def method_recipe(name: str) -> Mapping[str, Any]:
    """The common-key values method ``name`` declares as its own recipe (``MethodDecl.recipe``), or {}; an unknown
    method gives {} (RunConfig.from_dict refuses it by name afterwards)."""
    from flcore.registry import methods

    decl = methods().get(name)
    return decl.recipe if decl is not None else {}


def _check_method(name: str) -> None:
    from flcore.registry import methods

    table = methods()
    if name not in table:
        raise ConfigError(f"run-config key 'method' got {name!r}; allowed: one of {', '.join(table)}")


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
    return apply_preset(values, known, explicit=overrides or {}, recipe_of=method_recipe)


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

