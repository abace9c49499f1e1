"""Test-wide settings: one torch thread in every process that runs tests, and the ``image`` marker.

Markers (pyproject.toml declares ``slow``):
    slow   end-to-end runs that start real processes (Ray, SuperLink/SuperNodes, nginx, podman);
    image  the container-image build (deploy/docker/build_local.sh with podman) and a SuperNode run from
           its image: minutes with podman's layer cache, 10-15 min on a fresh machine (Debian packages and
           torch are downloaded), so CI runs it as a step of its own (``pytest -m image``, .ci/run) after
           the rest (``pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not image"``).
"""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bytecode caches on, for this process and the ones it starts (xdist workers, CLI and Flower subprocesses):
# with PYTHONDONTWRITEBYTECODE set (some shells and sandboxes set it), pytest re-rewrites the asserts of every
# test module in every worker on every run, 7.5 s of each worker's 15 s collection; the caches are
# __pycache__ folders, which .gitignore lists.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest's Config
    # One torch thread in every process that runs tests. pytest-xdist's controller runs none: importing torch
    # there (about 2 s) held back the start of the workers.
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", default=None):
        import torch

        torch.set_num_threads(1)
    config.addinivalue_line("markers", "image: builds the container images with podman (run on its own: "
                                       "pytest -m image; see tests/conftest.py)")


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 - pytest's Config and Items
    """Files with the most ``slow`` tests (real processes: tens of seconds each) run first, each file's tests
    in their own order. With ``pytest -n 2 --dist loadfile --no-loadscope-reorder`` the two workers then
    start on the long files and fill in with the short ones, instead of xdist's default order (files with
    the most tests first), which left the few-but-long deployment and Ray files for last: one worker ran
    them alone at the end."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    slow = {path: sum(1 for it in group if it.get_closest_marker("slow") is not None) for path, group in files.items()}
    order = sorted(files, key=lambda path: -slow[path])  # stable: ties keep collection order
    items[:] = [it for path in order for it in files[path]]


def pytest_report_header(config) -> list[str]:  # noqa: ANN001 - pytest's Config
    """Say which stack the run is on and how the known outputs are checked (bit-exact only on the recorded,
    locked stack; within tolerance elsewhere), so a CI log shows it."""
    import json

    from flcore.stack import describe, stack_info
    from tests.known_outputs import KNOWN, exact_mode

    exact, why = exact_mode(json.loads(KNOWN.read_text())["stack"])
    return [f"stack: {describe(stack_info())}",
            "known outputs: " + ("bit-exact (the recorded stack)" if exact else f"within tolerance: {why}")]
