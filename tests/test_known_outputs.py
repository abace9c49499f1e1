"""Known outputs (issue 16): every method's fixed-seed tiny job reproduces its recorded final-parameter
digest bit for bit on CPU. See tests/known_outputs.py for the jobs and how to re-record."""

import json

import pytest

from tests.known_outputs import KNOWN, run_job

JOBS = json.loads(KNOWN.read_text())


@pytest.mark.parametrize("job", sorted(JOBS))
def test_known_output(job, tmp_path):
    spec = JOBS[job]
    assert run_job(spec["run_config"], tmp_path / "run") == spec["sha256"], (
        f"{job}: final parameters changed; if intended, re-record with `python -m tests.known_outputs "
        f"{job}` and say why in the commit")
