"""What ``noniid-fl methods`` and ``noniid-fl config [METHOD]`` print: the registry and the declared keys."""

from __future__ import annotations

import difflib
import textwrap

from flcore.config import CommonConfig, ConfigError, section_classes
from flcore.pyproject import toml_value
from flcore.registry import MethodDecl, methods
from flcore.schema import KeySpec, Section


def method_line(decl: MethodDecl, width: int) -> str:
    note = f" - {decl.description}" if decl.description else ""
    return f"  {decl.name:<{width}}  {decl.paper}{note}"


def methods_text() -> str:
    """One line per method (name, paper, what the variant changes), then the paper presets."""
    table = methods()
    width = max(map(len, table))
    lines = ["methods (run one with -c \"method='NAME'\"; `noniid-fl config NAME` lists its keys):"]
    lines += [method_line(d, width) for d in table.values()]
    return "\n".join(lines) + "\n\n" + presets_text()


def presets_text() -> str:
    """The paper presets by paper: name and setting, then the run command's --nodes and every value it sets
    (``*`` our choice where the paper is silent, ``~`` stated but not expressible exactly; docs/PRESETS.md)."""
    from flcore.presets import presets
    from flcore.presets_doc import assignments

    table = presets()
    width = max(map(len, table))
    lines = ["paper presets (run one with: noniid-fl run --nodes K -c \"preset='NAME'\"; * = our choice where the "
             "paper states no value, ~ = stated but not expressible exactly; sources and reasons: docs/PRESETS.md):"]
    paper = None
    for p in table.values():
        if p.paper != paper:
            paper = p.paper
            lines.append(f" {paper}")
        lines.append(f"  {p.name:<{width}}  {p.setting}")
        words = " ".join([f"--nodes {p.num_supernodes}", *assignments(p)])
        lines += textwrap.wrap(words, 116, initial_indent=" " * 6, subsequent_indent=" " * 6,
                               break_on_hyphens=False, break_long_words=False)
    return "\n".join(lines)


def key_line(spec: KeySpec, width: int) -> str:
    was = f" (was {spec.old})" if spec.old else ""
    return f"  {spec.key:<{width}} = {toml_value(spec.default):<12} [{spec.allowed}]  {spec.doc}{was}"


def section_text(cls: type[Section], users: list[str]) -> list[str]:
    specs = cls.specs()
    width = max(len(s.key) for s in specs)
    if cls is CommonConfig:
        head = "common keys (flat; every method reads them):"
    else:
        head = f"[{cls.NAME}] keys of {', '.join(users)} (sectioned: -c \"{specs[0].key}=...\"):"
    return [head, *(key_line(s, width) for s in specs)]


def config_text(method: str | None = None) -> str:
    """Every key with its default, bounds and doc; with ``method``, the common keys and that method's section."""
    table = methods()
    if method is not None and method not in table:
        close = difflib.get_close_matches(method, list(table), n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"unknown method {method!r}; {hint}allowed: one of {', '.join(table)} "
                          "(`noniid-fl methods`)")
    users: dict[str, list[str]] = {}
    for decl in table.values():
        if decl.config is not None:
            users.setdefault(decl.config.NAME, []).append(decl.name)
    chosen = section_classes()
    if method is not None:
        own = table[method].config
        chosen = [CommonConfig] + ([own] if own is not None else [])
    blocks = [section_text(c, users.get(c.NAME, [])) for c in chosen]
    if method is not None and table[method].config is None:
        blocks.append([f"{method} has no keys of its own."])
    if method is not None and table[method].recipe:
        decl = table[method]
        blocks.append([f"{method}'s recipe (common keys it sets under a preset and what you set):",
                       *(f"  {k} = {toml_value(v)}  ({decl.recipe_sources[k]})" for k, v in decl.recipe.items())])
    lines = ["run-config keys: key = default [allowed] doc; override with -c \"key=value ...\" "
             "(noniid-fl run, flwr run)", ""]
    for block in blocks:
        lines += block + [""]
    return "\n".join(lines).rstrip() + "\n"
