"""docs/PERFORMANCE.md section 8 from precision result files (benchmarks/report_precision.py)."""

from benchmarks.report_precision import section_precision, summary_line


def row(job, threads, precision, wall, cpu=None):
    return {"job": job, "threads": threads, "precision": precision, "wall_per_round_s": wall,
            "cpu_per_round_s": cpu or wall, "rounds_timed": 2, "load_at_start": 0.5, "final_global_accuracy": 0.6}


def part(threads, precision, last, train):
    return {"threads": threads, "precision": precision, "channels_last": last, "forward_backward_img_s": train * 1.02,
            "optimizer_step_img_s": 60000.0, "train_img_s": train, "eval_img_s": 2 * train}


DOC = {"machine": {"cpus": 2, "platform": "Linux", "cpu_capability": "AVX512"},
       "jobs": {"fmnist-fedavg": {"clients": 20}, "digits-mlp": {"clients": 10}},
       "rows": [row("fmnist-fedavg", 1, "fp32", 45.0), row("fmnist-fedavg", 1, "bf16-mixed", 15.0),
                row("digits-mlp", 1, "fp32", 0.2), row("digits-mlp", 1, "bf16-mixed", 0.25)],
       "loop_parts": [part(1, "fp32", False, 1500.0), part(1, "fp32", True, 1400.0),
                      part(1, "bf16-mixed", False, 2400.0), part(1, "bf16-mixed", True, 4800.0)]}


def test_the_summary_states_the_fmnist_round_gain_against_the_2x_target():
    (line,) = summary_line(DOC)
    assert "45.0 s at fp32 and 15.0 s at bf16" in line and "**3.00 x**" in line and "**met**" in line
    assert "ceiling 3.20 x" in line
    slow = {**DOC, "rows": [row("fmnist-fedavg", 1, "fp32", 45.0), row("fmnist-fedavg", 1, "bf16-mixed", 30.0)]}
    assert "**not met**" in summary_line(slow)[0]
    assert summary_line(None) == []


def test_the_section_tabulates_every_job_and_says_where_the_rest_goes():
    text = "\n".join(section_precision(DOC, None))
    assert "| fmnist-fedavg | 20 | 1 | 45.00 (45.00) | 15.00 (15.00) | **3.00x** | 3.00x |" in text
    assert "| digits-mlp | 10 | 1 | 0.20 (0.20) | 0.25 (0.25) | **0.80x** |" in text   # a slowdown is shown as such
    # 60,000 images at 1,500 img/s = 40.0 s of the 45.0 s round; the rest 5.0 s
    assert "would take 40.0 s at fp32 and 12.5 s at bf16" in text
    assert "the rest of the round, 5.0 s at fp32 and 2.5 s at bf16" in text
    fast = {**DOC, "rows": [row("fmnist-fedavg", 1, "fp32", 39.0), row("fmnist-fedavg", 1, "bf16-mixed", 12.0)]}
    assert "within the plain loop's own noise" in "\n".join(section_precision(fast, None))
    assert "Slower at bf16-mixed: digits-mlp." in text
    assert "GPU: not measured." in text
    gpu = {"dry_run": False, "machine": {"gpu": "NVIDIA H200"}, "batch_size": 64, "per_client_images": 500,
           "rows": [{"model": "convnet", "numerics": "tf32", "workers": 2, "clients": 100, "clients_per_s": 12.5,
                     "peak_allocated_mib_per_worker": 100.0, "peak_reserved_mib_per_worker": 120.0,
                     "gpu_used_mib_peak": 2048.0}]}
    text = "\n".join(section_precision(DOC, gpu))
    assert "| convnet | tf32 | 2 | 12.50 | 100 | 120 | 2048 |" in text and "NVIDIA H200" in text
    assert "GPU: not measured." in "\n".join(section_precision(DOC, {**gpu, "dry_run": True}))


def test_the_readme_states_the_measured_factor():
    """README's run section names the one key that speeds a run up here, with the factor the result file holds."""
    import json
    import re
    from pathlib import Path

    from benchmarks.report_precision import round_gain

    root = Path(__file__).resolve().parents[1]
    doc = json.loads((root / "benchmarks" / "results" / "precision.json").read_text())
    gain = round_gain(doc)[2]
    m = re.search(r"`precision='bf16-mixed'`\. A\s+Fashion-MNIST FedAvg round \(20 clients, the ConvNet\) runs "
                  r"(\d+\.\d\d)x as fast as at fp32", (root / "README.md").read_text())
    assert m is not None and m.group(1) == f"{gain:.2f}"
