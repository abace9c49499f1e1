"""The `noniid-fl` command: every bad config refused before any engine starts (exit code 2, one to three lines
naming the key, the bad value and what is allowed, no traceback), the listings (`methods`, `config [METHOD]`)
against the registry and the declarations, `--help` on each. The refusal cases call the command's ``main`` in
this process (what ``python -m cli`` runs, less the process); the entry point itself (its exit code, that a
refusal imports no engine, ``--verbose``, the listings) runs in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flcore.config import all_specs
from flcore.pyproject import toml_value
from flcore.registry import methods
from server_app.preflight import GPU_DRIVER_FILES

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run the command line (a 120 s timeout guards against a hang; how fast a refusal comes is no test's
    business, issue 39); returns the process and its wall time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc, time.perf_counter() - t0


def refuse(*args: str, cwd: Path, capsys: pytest.CaptureFixture[str],
           monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """The command's ``main`` on ``args`` in this process, in ``cwd``; returns (exit code, stdout + stderr)."""
    from cli.main import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own usage errors exit
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def _prepare(tmp_path: Path) -> dict[str, str]:
    """Paths some cases need: a file, a directory holding another run, an empty data-root."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "old-run").mkdir()
    (tmp_path / "old-run" / "results.json").write_text("{}")
    (tmp_path / "data").mkdir()
    return {"file": str(tmp_path / "a-file"), "old": str(tmp_path / "old-run"), "data": str(tmp_path / "data")}


HAS_GPU_DRIVER = any(os.path.exists(p) for p in GPU_DRIVER_FILES)

# (case id, -c overrides (with {file}/{old}/{data} filled in), extra CLI args, words the message must contain)
CASES = [
    ("unknown method", "method='fedprx'", [], ["'method'", "'fedprx'", "did you mean 'fedprox'", "fedavg"]),
    ("unknown dataset", "dataset='cifar11'", [], ["'dataset'", "'cifar11'", "cifar10"]),
    ("unknown model", "model='vgg12'", [], ["'model'", "'vgg12'", "vgg11"]),
    ("unknown partition", "partition='dirichlett'", [], ["'partition'", "'dirichlett'", "dirichlet"]),
    ("unknown head", "head='etff'", [], ["'head'", "'etff'", "linear, etf"]),
    ("misspelled key", "dirichlet-alph=0.1", [], ["'dirichlet-alph'", "did you mean 'dirichlet-alpha'"]),
    ("misspelled section key", "fedprox.muu=0.1", [], ["'fedprox.muu'", "did you mean 'fedprox.mu'"]),
    ("renamed key", "proximal-mu=0.1", [], ["'proximal-mu'", "'fedprox.mu'"]),
    ("wrong type (string)", "lr='abc'", [], ["'lr'", "'abc'", "float"]),
    ("wrong type (not TOML)", "lr=abc", [], ["'lr'", "abc", "lr='abc'"]),
    ("wrong type (bool)", "num-server-rounds=true", [], ["'num-server-rounds'", "True", "int"]),
    ("infinite", "lr=inf", [], ["'lr'", "inf", "> 0, finite"]),
    ("nan", "dirichlet-alpha=nan", [], ["'dirichlet-alpha'", "nan", "> 0, finite"]),
    ("below range", "seed=-1", [], ["'seed'", "-1", ">= 0"]),
    ("above range", "fraction-train=1.5", [], ["'fraction-train'", "1.5", "<= 1"]),
    ("section bound", "fedprox.mu=-1", [], ["'fedprox.mu'", "-1", ">= 0"]),
    ("vgg11 on 8x8 digits", "dataset='digits' model='vgg11'", [],
     ["'model'", "'vgg11'", "digits", "1x8x8", "32x32", "mlp"]),
    ("convnet on vectors", "dataset='synthetic' partition='natural' model='convnet'", [],
     ["'model'", "'convnet'", "synthetic", "image inputs", "logistic"]),
    ("dataset files missing", "dataset='cifar10' data-root='{data}'", [],
     ["'dataset'", "'cifar10'", "{data}/cifar-10-batches-py/data_batch_1", "download=true"]),
    ("out-dir under a file", "out-dir='{file}/out'", [], ["'out-dir'", "{file}", "is a file"]),
    ("out-dir holds another run", "out-dir='{old}'", [], ["'out-dir'", "{old}", "--overwrite"]),
    ("resume-from without checkpoint", "resume-from='{data}'", [], ["'resume-from'", "{data}/checkpoint.pt"]),
    ("fewer nodes than min-train-nodes", "min-train-nodes=5", ["--nodes", "3"], ["'min-train-nodes'", "5", "<= 3"]),
    ("not key=value", "lr 0.1", [], ["'lr'", "key=value"]),
]
if not HAS_GPU_DRIVER:  # on a GPU machine device='cuda' is a valid config (checked in test_preflight)
    CASES.append(("cuda without a GPU", "device='cuda'", [], ["'device'", "'cuda'", "auto, cpu"]))


@pytest.mark.parametrize("overrides, extra, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_is_refused_before_any_engine_naming_the_key(tmp_path, overrides, extra, words, capsys,
                                                                 monkeypatch):
    paths = _prepare(tmp_path)
    code, out = refuse("run", *extra, "-c", overrides.format(**paths), cwd=tmp_path, capsys=capsys,
                       monkeypatch=monkeypatch)
    out = out.strip()
    assert code == 2, out
    assert 1 <= len(out.splitlines()) <= 3 and "Traceback" not in out, out
    assert out.startswith("noniid-fl: error:"), out
    for word in words:
        assert word.format(**paths) in out, (word, out)
    assert not (tmp_path / "runs").exists()  # nothing was created


def test_the_entry_point_exits_2_with_mains_one_line_refusal(tmp_path):
    proc, _ = cli("run", "-c", "method='fedprx'", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        line for line in proc.stderr.strip().splitlines() if line.startswith("noniid-fl: error:")], proc.stderr
    assert "'fedprx'" in proc.stderr and "did you mean 'fedprox'" in proc.stderr


def test_verbose_adds_the_traceback(tmp_path):
    proc, _ = cli("run", "--verbose", "-c", "lr=inf", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "'lr'" in proc.stderr


def test_a_refusal_imports_no_engine(tmp_path):
    """The checks run before torch, Ray or Flower's simulation are imported (the 3-second budget)."""
    code = ("import sys; from cli.main import main; rc = main(['run', '-c', \"dataset='digits' model='vgg11'\"]); "
            "print(rc, sorted(m for m in ('torch', 'ray', 'flwr.simulation', 'engines.local') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.strip().splitlines()[-1] == "2 []", proc.stdout + proc.stderr


def test_check_accepts_a_good_config_and_names_the_default_out_dir(tmp_path):
    proc, _ = cli("run", "--check", "--nodes", "4", "-c", "method='fedprox' fedprox.mu=0.1 dataset='digits'",
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"-> (\S+)$", proc.stdout.strip())
    assert m and re.fullmatch(re.escape(str(tmp_path / "runs" / "fedprox-")) + r"\d{8}-\d{6}", m.group(1))
    assert not (tmp_path / "runs").exists()


def test_usage_errors_exit_2(tmp_path):
    assert cli("run", "--nodes", "many", cwd=tmp_path)[0].returncode == 2
    assert cli("run", "--engine", "spark", cwd=tmp_path)[0].returncode == 2
    assert cli("frobnicate", cwd=tmp_path)[0].returncode == 2
    proc, _ = cli("config", "fedprx", cwd=tmp_path)
    assert proc.returncode == 2 and "did you mean 'fedprox'" in proc.stderr


def test_methods_lists_every_registered_method_with_its_paper(tmp_path):
    proc, _ = cli("methods", cwd=tmp_path)
    assert proc.returncode == 0
    rows = {line.split()[0]: line for line in proc.stdout.split("\n\n")[0].splitlines()[1:]}  # presets follow
    assert list(rows) == list(methods())
    for name, decl in methods().items():
        assert decl.paper in rows[name] and decl.description in rows[name]


def test_readme_method_table_matches_the_registry():
    table = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]
    names = [n for line in table for n in re.findall(r"`([a-z][a-z0-9-]*)`", line.split("|")[1])]
    assert sorted(names) == sorted(methods())


def test_config_lists_every_key_with_default_bounds_and_doc(tmp_path):
    proc, _ = cli("config", cwd=tmp_path)
    assert proc.returncode == 0
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("  ")}
    specs = all_specs()
    assert set(lines) == set(specs)
    for key, spec in specs.items():
        line = lines[key]
        assert f"= {toml_value(spec.default)}" in line and f"[{spec.allowed}]" in line and spec.doc in line, line


def test_config_of_a_method_shows_the_common_keys_and_its_section_only(tmp_path):
    proc, _ = cli("config", "fedprox", cwd=tmp_path)
    keys = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert "lr" in keys and "fedprox.mu" in keys and not any(k.startswith("scaffold.") for k in keys)
    assert "(was proximal-mu)" in proc.stdout
    proc, _ = cli("config", "fedavg", cwd=tmp_path)
    assert "fedavg has no keys of its own" in proc.stdout and "fedprox.mu" not in proc.stdout


@pytest.mark.parametrize("command", [[], ["run"], ["methods"], ["config"]])
def test_help(tmp_path, command):
    proc, _ = cli(*command, "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: noniid-fl {' '.join(command)}".rstrip())
    if command == ["run"]:
        for flag in ("--nodes", "-c", "--engine", "--workers", "--overwrite", "--verbose", "Exit codes"):
            assert flag in proc.stdout


def test_readme_set_up_commands_come_first_and_the_test_command_is_cis():
    """Install, then the fast tier (the command CI's newest-stack tier runs), then CI's own test lines."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    install = "pip install --require-hashes -r requirements.lock && pip install --no-deps -e ."
    assert blocks[0].splitlines()[-1] == "noniid-fl run" and install in blocks[0]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    fast = blocks[1].strip().splitlines()
    assert len(fast) == 1 and fast[0].startswith("pytest") and fast[0] in ci[-3:], fast
    test_block = blocks[2].strip().splitlines()
    at = ci.index(test_block[0])            # CI runs the README's test lines in order (then the newest tier)
    assert test_block == ci[at:at + len(test_block)] and test_block[-1].startswith("pytest")
    assert any(install in line for line in ci[:at])
    assert "pkill" not in readme and "killall" not in readme
