"""Section 4 of docs/PERFORMANCE.md: deployment vs simulation latency (bench_deployment's output, verbatim)
and where a deployment round goes. Prose: docs/templates/performance/deployment.md."""

from __future__ import annotations

from pathlib import Path

from benchmarks.report_text import blocks

T = blocks("deployment")


def deployment_block_from_doc(doc_dir: Path) -> str | None:
    """The bench_deployment output recorded in ``doc_dir``/DEPLOYMENT.md (its Performance section), if any."""
    path = doc_dir / "DEPLOYMENT.md"
    if not path.exists():
        return None
    for block in path.read_text().split("```")[1::2]:  # the contents of fenced blocks
        if "benchmarks.bench_deployment" in block and "ratio" in block:
            return block.strip()
    return None


def section_deployment(text: str | None, profile: str | None, polls: str | None, doc_dir: Path,
                       state: str | None = None) -> list[str]:
    """``text``: benchmarks/results/deployment.txt; ``profile`` / ``polls`` / ``state``: the tuned-mode profile,
    poll and SuperLink-state runs (deployment_profile.txt, deployment_polls.txt, deployment_state.txt); without
    ``text``, the run recorded in DEPLOYMENT.md."""
    out = T.lines("intro")
    recorded = None if text else deployment_block_from_doc(doc_dir)
    if text:
        out += T.lines("printed", text=text)
    elif recorded:
        out += T.lines("recorded", text=recorded)
    else:
        out += T.lines("not_included")
    return out + deployment_profile(profile, polls, state)


def deployment_profile(profile: str | None, polls: str | None, state: str | None = None) -> list[str]:
    """Where a deployment round's time goes (issue 17 item 4): the tuned profile and poll runs, verbatim,
    and the path of one message with the Flower setting behind each wait."""
    if profile is None:
        return []
    return (T.lines("profile", profile=profile) + (T.lines("polls", polls=polls) if polls else [])
            + (T.lines("state", state=state) if state else []) + T.lines("reading"))
