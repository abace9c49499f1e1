"""``-c "key=value ..."``: the override syntax of ``flwr run -c``, read by Flower's own parser.

Flower's parser silently drops a word without ``=`` and answers a value that is not TOML with one generic
message; here each is refused naming the word (strings need quotes: ``method='fedprox'``).
"""

from __future__ import annotations

import re
from typing import Any

from flcore.config import ConfigError


PAIR = re.compile(r"""([^\s=]+)=('[^']*'|"[^"]*"|\S+)""")  # key=value, value quoted or up to a space


def _words(line: str) -> list[str]:
    """The key=value words of ``line``; anything else in it is an error naming it."""
    leftover = PAIR.sub(" ", line).split()
    if leftover:
        raise ConfigError(f"-c: {leftover[0]!r} is not key=value (e.g. -c \"lr=0.1 method='fedprox'\")")
    return [m.group(0) for m in PAIR.finditer(line)]


def parse_overrides(lines: list[str] | None) -> dict[str, Any]:
    """The flat overrides of every ``-c`` (several are merged; a ``.toml`` file alone, as in flwr)."""
    if not lines:
        return {}
    pairs = [w for line in lines if not line.endswith(".toml") for w in _words(line)]
    import click
    from flwr.common.config import parse_config_args

    try:
        return dict(parse_config_args(lines))
    except click.ClickException as exc:
        for word in pairs:
            try:
                parse_config_args([word])
            except click.ClickException:
                key, _, value = word.partition("=")
                raise ConfigError(f"-c: the value of '{key}' is not a TOML value: {value} (numbers and true/false "
                                  f"as they are, strings in quotes: {key}='{value}')") from None
        raise ConfigError(f"-c: {exc.message}") from None
    except (ValueError, OSError) as exc:  # a .toml file next to pairs, a missing or malformed .toml file
        raise ConfigError(f"-c: {exc}") from None
