"""scripts/fmnist_table_gpu.sh (FedRANE's FMNIST tables at the paper's local budget on a lent GPU) is run rarely,
on a machine a session gets by chance: its dry run, which needs neither a GPU nor the data, must plan every row
of the three CPU tables with the GPU budget substituted, or the GPU time is lost to a broken script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_dry_run_plans_every_row_of_the_three_tables_at_the_gpu_budget():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "fmnist_table_gpu.sh"), "7"], cwd=ROOT,
                          env={**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    planned = re.findall(r"fmnist-table-(dir\w+)-gpu\.toml (\S+)$", proc.stdout, flags=re.M)
    for column in ("dir01", "dir05", "dir5"):
        runs = tomllib.loads((ROOT / "experiments" / "configs" / f"fmnist-table-{column}.toml").read_text())["runs"]
        assert [label for c, label in planned if c == column] == list(runs)
    configs = [tomllib.loads(part) for part in re.split(r"(?m)^(?=# FedRANE's Fashion-MNIST)", proc.stdout)
               if "[experiment]" in part]
    assert len(configs) == 3
    for cfg in configs:
        base = cfg["base"]
        assert (base["num-server-rounds"], base["local-epochs"], base["max-local-steps"], base["batch-size"]) == \
            (7, 5, 0, 128)
        assert cfg["experiment"]["name"].endswith("-gpu")
        assert cfg["runs"]["fedbabu"]["fedbabu.finetune-max-steps"] == 0   # the paper's full fine-tuning
