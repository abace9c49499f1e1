"""Generates docs/PROTOCOL.md: the template docs/templates/PROTOCOL.md.tmpl filled with tables built from
the base protocol (flcore/protocol.py), the faces (flcore/faces.py) and every method's declaration::

    python -m flcore.protocol_doc > docs/PROTOCOL.md

The meaning of a method's payload key is the trailing comment of the constant that names it in the
method's declaration module (``LAMBDA_KEY = "fedbc-lambda"   # per-client config ...``).
"""

from __future__ import annotations

import io
import sys
import tokenize
from pathlib import Path
from string import Template

from flcore import protocol
from flcore.faces import numpy_client_problem, start_problem, stock_fedavg_problem
from flcore.methods import MODULES, declarations

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "docs" / "templates" / "PROTOCOL.md.tmpl"


def _names(names) -> str:
    return ", ".join(f"`{n}`" for n in names) or "—"


def messages_table() -> str:
    p = protocol
    relay = list(dict.fromkeys(a for d in methods().values() for a in d.payload.actions if a != p.TRAIN))
    rows = [
        (f"`{p.QUERY}`", "registration: to each node not yet known, before its first round",
         _names([p.RUN_CONFIG]), f"`{p.INFO}` ({_names(p.QUERY_INFO_KEYS)})"),
        (f"`{p.TRAIN}`", "each round, to each sampled client",
         f"`{p.RUN_CONFIG}`, `{p.ARRAYS}`, `{p.CONFIG}` ({_names(p.CONFIG_KEYS)} + method keys), "
         f"`{p.CLIENT_STATE}` ({_names(p.CLIENT_STATE_KEYS)}), method records",
         f"`{p.ARRAYS}`, `{p.METRICS}` ({_names(p.TRAIN_METRICS)} + method metrics), method records"),
        (_names(relay), "phases of a multi-exchange round (methods that declare them)",
         f"as `{p.TRAIN}`", f"as `{p.TRAIN}`"),
        (f"`{p.EVALUATE}`", "federated evaluation (every `federated-eval-every` rounds and the last)",
         f"`{p.RUN_CONFIG}`, `{p.ARRAYS}`, `{p.CONFIG}` ({_names(p.CONFIG_KEYS)})",
         f"`{p.METRICS}` ({_names(p.EVAL_METRICS)})"),
    ]
    head = "| message type | sent | server -> client records | reply records |\n|---|---|---|---|\n"
    return head + "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _short(path: str) -> str:
    return "`" + path.split(":")[1] + "`"


def methods() -> dict:
    """The project's declared methods (not ones registered at runtime by a user or a test)."""
    return {d.name: d for d in declarations()}


def methods_table() -> str:
    head = ("| method | Strategy | trainer | config keys -> | records -> | <- metrics | <- records | "
            "actions | client state |\n|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for d in methods().values():
        pay = d.payload
        rows.append(f"| `{d.name}` | {_short(d.strategy)} | {_short(d.trainer)} | {_names(pay.config)} | "
                    f"{_names(pay.records)} | {_names(pay.metrics)} | {_names(pay.reply_records)} | "
                    f"{_names(pay.actions)} | {_names(pay.state)} |")
    return head + "\n".join(rows) + "\n\nA record name ending in `.` is a prefix (`fedufo.prior.<cid>`)."


def key_comments() -> dict[str, str]:
    """key -> the trailing comment of every module-level ``NAME = "key"  # comment`` line in
    the declaration modules (flcore/methods/*)."""
    out: dict[str, str] = {}
    for name in MODULES:
        path = ROOT / "flcore" / "methods" / f"{name}.py"
        line: list[tokenize.TokenInfo] = []
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.NL):
                line = []
                continue
            line.append(tok)
            if ([t.type for t in line] == [tokenize.NAME, tokenize.OP, tokenize.STRING, tokenize.COMMENT]
                    and line[0].start[1] == 0 and line[1].string == "="):
                out[line[2].string.strip("\"'")] = tok.string.lstrip("# ").strip()
    return out


def glossary() -> str:
    comments = key_comments()
    rows, seen = [], set()
    for d in methods().values():
        pay = d.payload
        for key in (*pay.config, *pay.records, *pay.metrics, *pay.reply_records, *pay.state):
            if key not in seen:
                seen.add(key)
                trainer = "client_app/" + d.trainer.split(":")[0].split(".", 1)[1].replace(".", "/") + ".py"
                meaning = comments.get(key, f"(no comment on a constant; produced by `{trainer}`)")
                rows.append(f"| `{key}` | `{d.name}` | {meaning} |")
    return ("Payload keys (meaning: the comment on the key's constant in its declaration module):\n\n"
            "| key | first declared by | meaning |\n|---|---|---|\n" + "\n".join(rows))


def faces_table() -> str:
    checks = (("Strategy.start()", start_problem), ("NumPyClient", numpy_client_problem),
              ("stock FedAvg", stock_fedavg_problem))
    head = "| method | " + " | ".join(n for n, _ in checks) + " |\n|---|" + "---|" * len(checks) + "\n"
    rows, why = [], []
    for d in methods().values():
        problems = [fn(d) for _, fn in checks]
        rows.append(f"| `{d.name}` | " + " | ".join("yes" if p is None else "no" for p in problems) + " |")
        listed: list[str] = []
        for (name, _), p in zip(checks, problems):
            if p is not None and p not in listed:
                listed.append(p)
                why.append(f"- `{d.name}`, {name}: {p}.")
    return head + "\n".join(rows) + "\n\nWhy not (a reason is listed once, under the first face it rules out):\n\n" \
        + "\n".join(why)


def render() -> str:
    return Template(TEMPLATE.read_text()).substitute(messages=messages_table(), methods=methods_table(),
                                                      glossary=glossary(), faces=faces_table())


if __name__ == "__main__":
    sys.stdout.write(render())
