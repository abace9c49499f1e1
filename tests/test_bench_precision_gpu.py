"""The GPU precision benchmark's dry run (benchmarks/bench_precision_gpu.py): on the CPU, the same code paths as on a
lent GPU (spawned workers, the local loop under the run-config numerics, the result file), so a GPU's minutes are
not lost to a broken script."""

import json

import pytest

from benchmarks.bench_precision_gpu import main


@pytest.mark.slow
def test_the_dry_run_measures_every_model_and_cpu_precision(tmp_path):
    out = tmp_path / "precision_gpu.json"
    assert main(["--dry-run", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["dry_run"] is True and doc["stack"]["packages"]["torch"]
    cases = {(r["model"], r["numerics"], r["workers"]) for r in doc["rows"]}
    assert cases == {(m, n, 1) for m in ("convnet", "resnet18") for n in ("fp32", "bf16-mixed")}
    for r in doc["rows"]:
        assert r["timed_clients"] == 1 and r["clients_per_s"] > 0 and r["wall_s"] > 0
    assert doc["skipped"] == [{"numerics": "tf32", "why": "TF32 needs CUDA (a dry run is on the CPU)"}]


def test_without_a_gpu_the_real_run_refuses_and_says_how_to_dry_run(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--dry-run"):
        main([])
