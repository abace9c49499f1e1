"""Test-wide settings: one torch thread per process, and the ``image`` marker.

Markers (pyproject.toml declares ``slow``):
    slow   end-to-end runs that start real processes (Ray, SuperLink/SuperNodes, nginx, podman);
    image  the container-image build (deploy/docker/build_local.sh with podman) and a SuperNode run from
           its image: minutes with podman's layer cache, 10-15 min on a fresh machine (Debian packages and
           torch are downloaded), so CI runs it as a step of its own (``pytest -m image``, .ci/run) after
           the rest (``pytest -n 2 --dist loadfile -m "not image"``).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest's Config
    config.addinivalue_line("markers", "image: builds the container images with podman (run on its own: "
                                       "pytest -m image; see tests/conftest.py)")
