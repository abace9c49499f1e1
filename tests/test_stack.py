"""The locked stack (issue 30): the lock file, what the installs and Flower's per-run install take from it,
the stack every result names, and the docs' version statements."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from flcore.stack import (LOCK_FILE, Locked, describe, lock_differences, lock_digest, normalize, parse_lock,
                          read_lock, stack_info)

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
H1, H2 = "a" * 64, "b" * 64


def test_parse_lock_reads_pins_hashes_and_continuations():
    text = f"# comment\nFoo_Bar==1.2.3 \\\n    --hash=sha256:{H1} \\\n    --hash=sha256:{H2}\nbaz==0.1 --hash=sha256:{H1}\n"
    got = parse_lock(text)
    assert got == {"foo-bar": Locked("foo-bar", "1.2.3", (H1, H2)), "baz": Locked("baz", "0.1", (H1,))}
    assert lock_digest(got) == lock_digest(dict(reversed(got.items())))          # order-free
    assert lock_digest(got) != lock_digest({**got, "baz": Locked("baz", "0.2", (H1,))})


@pytest.mark.parametrize("text, message", [
    ("foo>=1.0 --hash=sha256:" + H1, "entry 1 is not"),          # a range is not a pin
    ("foo==1.0", "entry 1 is not"),                               # no hash
    (f"foo==1.0 --hash=sha256:{H1}\nFoo==1.1 --hash=sha256:{H2}", "foo is pinned twice"),
])
def test_parse_lock_refuses_what_is_not_a_lock(text, message):
    with pytest.raises(ValueError, match=message):
        parse_lock(text)


def test_lock_differences_name_each_package():
    lock = {"a": Locked("a", "1", (H1,)), "b": Locked("b", "2", (H1,)), "c": Locked("c", "3", (H1,))}
    installed = {"a": "1", "b": "2.1", "d": "4", "pip": "26", "noniid-fl": "0.1.0"}
    assert lock_differences(lock, installed) == ["b: locked 2, installed 2.1", "c: locked 3, not installed",
                                                 "d: installed 4, not in the lock"]
    assert lock_differences(lock, {"a": "1", "b": "2", "c": "3", "pip": "9"}) == []


def test_the_lock_satisfies_every_declared_requirement():
    """Each direct dependency (and the test extra) is pinned, at a version its range allows."""
    lock = read_lock()
    reqs = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["test"]
    for text in reqs:
        req = Requirement(text)
        pin = lock.get(normalize(req.name))
        assert pin is not None, f"{req.name} is not in requirements.lock"
        assert req.specifier.contains(pin.version, prereleases=True), f"{req.name} {pin.version} outside {req.specifier}"
    assert all(len(p.hashes) >= 1 for p in lock.values())
    for name in ("flwr", "torch", "torchvision", "numpy", "cvxpy", "ray", "pytest"):
        assert name in lock


def test_flowers_per_run_install_is_pinned_to_the_lock():
    """Flower's runtime dependency installation runs `uv sync` on the FAB's pyproject.toml (flwr 1.42:
    supercore/superexec/dependency_installer.py), which honours [tool.uv] constraint-dependencies; the FAB
    carries pyproject.toml whole. Those pins are exactly the lock's."""
    pins = PYPROJECT["tool"]["uv"]["constraint-dependencies"]
    assert sorted(pins) == sorted(f"{p.name}=={p.version}" for p in read_lock().values())


def test_the_images_install_the_lock():
    text = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert "COPY requirements.lock ./" in text
    assert "pip install --require-hashes -r requirements.lock" in text
    assert "pip install --no-deps ." in text and "python -m flcore.stack --check" in text
    assert not re.search(r"pip install [^\n]*(torch|flwr)[=<>]", text)      # nothing installed beside the lock


def test_ci_and_readme_install_the_lock():
    install = "pip install --require-hashes -r requirements.lock && pip install --no-deps -e ."
    assert install in (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert install in ci and "python -m flcore.stack --check" in ci


def test_stack_info_names_the_running_stack():
    from importlib import metadata

    import torch

    info = stack_info()
    for name in ("flwr", "torch", "torchvision", "numpy", "cvxpy", "ray"):
        assert info["packages"][name] == metadata.version(name)
    assert info["python"].count(".") == 2 and info["device"] == ("cpu" if not torch.cuda.is_available()
                                                                  else torch.cuda.get_device_name(0))
    assert info["deterministic"]["torch_threads"] == torch.get_num_threads()
    assert info["lock"]["digest"] == lock_digest(read_lock())
    # What the stack compares: every installed distribution but the copies Ray vendors in ray/thirdparty_files
    # (on sys.path once another test in this worker imported ray); none of those is a distribution of its own.
    installed = {normalize(d.metadata["Name"]): d.version for d in reversed(list(metadata.distributions()))
                 if "thirdparty_files" not in Path(str(d.locate_file(""))).parts}
    assert info["lock"]["matches"] == (not lock_differences(read_lock(), installed))
    git = info["git"]
    assert git is None or re.fullmatch(r"[0-9a-f]{40}", git["commit"])


def test_describe_is_one_line_per_stack():
    stack = {"python": "3.11.7", "packages": {"flwr": "1.42.0", "torch": "2.14.1", "numpy": "2.4.6"},
             "device": "cpu", "cuda_available": False, "lock": {"matches": True, "digest": "abc"},
             "git": {"commit": "0123456789abcdef", "dirty": True}}
    assert describe(stack) == ("python 3.11.7, flwr 1.42.0, torch 2.14.1, numpy 2.4.6, device cpu, the lock (abc), "
                               "commit 0123456789 (dirty tree)")
    assert describe({**stack, "lock": {"matches": False, "differences": ["x", "y"]}, "git": None}).endswith(
        "NOT the lock (2+ differences)")
    assert describe(None).startswith("stack not recorded")
    # a result that records its code (flcore/code_digest.py) names it; one written before renders as before
    coded = {**stack, "code": {"digest": "0123abcd0123abcd", "files": 187}, "git": {**stack["git"], "code_dirty": True}}
    assert describe(coded) == describe(stack) + ", code 0123abcd0123abcd (not the commit's code)"
    clean = {**coded, "git": {**stack["git"], "code_dirty": False}}
    assert describe(clean) == describe(stack) + ", code 0123abcd0123abcd"
    assert describe({**coded, "git": None}).endswith("the lock (abc), code 0123abcd0123abcd")  # e.g. from a FAB
    assert describe({**stack, "code": None}) == describe(stack)  # run from an installed copy: no source tree


def test_a_run_records_its_stack_and_commit(tmp_path):
    from tests.known_outputs import COMMON, run_job

    from flcore.config import resolve_run_config

    values = resolve_run_config({**COMMON, "method": "fedavg", "num-server-rounds": 1})
    values.pop("out-dir")
    run_job(values, tmp_path / "run")
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert doc["stack"]["packages"] == stack_info()["packages"]
    assert doc["stack"]["lock"]["digest"] == lock_digest(read_lock())
    assert doc["stack"]["git"] == stack_info()["git"]
    assert doc["stack"]["code"] == stack_info()["code"] and len(doc["stack"]["code"]["digest"]) == 16


def test_docs_state_the_locked_flwr_version():
    """Every 'flwr 1.NN' / 'Flower 1.NN' in README, docs and deploy/ names the locked minor version."""
    locked = read_lock()["flwr"].version
    minor = ".".join(locked.split(".")[:2])
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "deploy").rglob("*"))]
    wrong = []
    for f in files:
        if not f.is_file() or f.suffix not in {".md", ".sh", ".py", ".yaml", ""}:
            continue
        for m in re.finditer(r"\b(?:flwr|Flower)(?:\[simulation\])?(?: |==)(1\.\d+)(\.\d+)?", f.read_text()):
            if m.group(1) != minor or (m.group(2) and m.group(1) + m.group(2) != locked):
                wrong.append(f"{f.relative_to(ROOT)}: {m.group(0)}")
    assert not wrong, wrong


def test_lock_file_is_at_the_root():
    assert LOCK_FILE == ROOT / "requirements.lock"


@pytest.mark.slow
def test_flowers_per_run_uv_sync_resolves_exactly_the_lock(tmp_path):
    """What flwr's runtime dependency installation runs (flwr 1.42, supercore/superexec/dependency_installer.py:
    `uv sync --python <python> --no-install-project --no-install-package flwr --inexact` in the unpacked FAB, into
    a fresh environment), as a dry run on this project's pyproject.toml: every package it would install is the
    locked version. (Resolves against PyPI: needs the package index, as the install does.)"""
    import inspect
    import subprocess
    import sys

    from flwr.supercore.superexec import dependency_installer

    source = inspect.getsource(dependency_installer.install_app_dependencies)
    flags = ["--no-install-project", "--no-install-package", "--inexact"]
    assert all(f'"{f}"' in source for f in flags) and '"sync"' in source  # flwr still runs this command
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    proc = subprocess.run([sys.executable, "-m", "uv", "sync", "--python", sys.executable, "--no-install-project",
                           "--no-install-package", "flwr", "--inexact", "--dry-run"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=300,
                          env={**__import__("os").environ, "UV_PROJECT_ENVIRONMENT": str(tmp_path / "env")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    would = dict(re.findall(r"^ \+ ([A-Za-z0-9._-]+)==(\S+)$", proc.stdout + proc.stderr, re.M))
    lock = read_lock()
    assert len(would) > 50 and "torch" in would
    wrong = {n: v for n, v in would.items() if normalize(n) not in lock or lock[normalize(n)].version != v}
    assert not wrong, wrong


def _update_lock():
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_lock", ROOT / "scripts" / "update_lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_update_lock_writes_a_lock_that_reads_back_and_says_what_moved(tmp_path):
    ul = _update_lock()
    pins = [Locked("b-pkg", "2.0", (H1,)), Locked("a", "1.0", (H1, H2))]
    text = ul.lock_text(pins, "26.3")
    assert parse_lock(text) == {p.name: p for p in pins}
    old = {"a": Locked("a", "0.9", (H1,)), "gone": Locked("gone", "3", (H1,))}
    assert ul.moves(old, parse_lock(text)) == ["  a: 0.9 -> 1.0", "  + b-pkg 2.0", "  - gone 3"]
    # the [tool.uv] pins go before the generated run-config tables (which run to the end of the file) and are
    # replaced in place the next time
    project = tmp_path / "pyproject.toml"
    project.write_text(f'[project]\nname = "x"\n\n{ul.RUN_CONFIG_MARKER}\n[tool.flwr.app.config]\nseed = 0\n')
    ul.write_uv_block(parse_lock(text), project)
    first = tomllib.loads(project.read_text())
    assert first["tool"]["uv"]["constraint-dependencies"] == ["a==1.0", "b-pkg==2.0"]
    assert project.read_text().index("[tool.uv]") < project.read_text().index(ul.RUN_CONFIG_MARKER)
    ul.write_uv_block({"a": Locked("a", "1.1", (H1,))}, project)
    again = project.read_text()
    assert again.count("[tool.uv]") == 1 and tomllib.loads(again)["tool"]["uv"]["constraint-dependencies"] == ["a==1.1"]
    assert tomllib.loads(again)["tool"]["flwr"]["app"]["config"] == {"seed": 0}


def test_an_unpacked_fab_checks_the_stack_against_pyprojects_pins(tmp_path, monkeypatch):
    """Under `flwr run` the app is unpacked from a FAB, which carries pyproject.toml but no requirements.lock:
    the stack is then compared with the same pins from [tool.uv] (and says so)."""
    import flcore.stack as stack

    lock = read_lock()
    fab = tmp_path / "fab"
    fab.mkdir()
    (fab / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    monkeypatch.setattr(stack, "LOCK_FILE", fab / "requirements.lock")
    monkeypatch.setattr(stack, "ROOT", fab)
    pins = stack.pyproject_pins()
    assert lock_digest(pins) == lock_digest(lock)                   # the same pins as the lock
    installed = {n: p.version for n, p in lock.items()}
    state = stack._lock_state(installed)
    assert state["file"] == "pyproject.toml [tool.uv]" and state["matches"] is True
    assert stack._lock_state({**installed, "torch": "9.9"})["differences"] == ["torch: locked 2.14.1, installed 9.9"]


def test_readme_states_the_locked_versions():
    """The README's statement of the stack ('flwr[simulation] X with Ray, PyTorch Y / torchvision Z') is the lock."""
    lock = read_lock()
    text = (ROOT / "README.md").read_text()
    m = re.search(r"flwr\[simulation\] (\S+) with Ray,\s+PyTorch (\S+) / torchvision (\S+)", text)
    assert m is not None
    assert m.groups() == (lock["flwr"].version, lock["torch"].version, lock["torchvision"].version)


def test_distributions_ray_vendors_on_sys_path_are_not_installed_ones(monkeypatch):
    """Importing ray prepends ray/thirdparty_files (psutil, colorama) to sys.path; the stack check must read the
    same installed stack with it there as without it (seen in CI when this file shared a worker with a Ray test).
    Compared with itself, not with the lock, so the newest tier (an unlocked install) checks it too."""
    import sys
    from pathlib import Path

    import ray

    from flcore.stack import installed_versions

    vendored = Path(ray.__file__).parent / "thirdparty_files"
    assert any(vendored.glob("*.dist-info")), "ray's wheel no longer vendors distributions: the test checks nothing"
    clean = [p for p in sys.path if Path(p) != vendored]
    monkeypatch.setattr(sys, "path", clean)
    without = installed_versions()
    monkeypatch.setattr(sys, "path", [str(vendored), *clean])
    assert installed_versions() == without


def test_cpu_facts_name_the_processor_its_isa_flags_and_a_digest_of_all_flags():
    from flcore.stack import cpu_facts

    block = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nstepping\t: 1\n"
             "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile f16c sha_ni\n")
    info = cpu_facts(block + "\n" + block.replace("processor\t: 0", "processor\t: 1"))
    assert info == {"vendor": "AuthenticAMD", "family": "25", "model": "17", "stepping": "1", "name": "AMD EPYC",
                    "isa": ["amx_tile", "avx2", "avx512_bf16", "avx512f", "f16c", "fma"],
                    "flags_digest": info["flags_digest"]}
    assert len(info["flags_digest"]) == 12
    # one flag more (another VM of the same kernel level) is another digest; the order they are listed in is not
    more = cpu_facts(block.replace("sha_ni", "sha_ni avx512_fp16"))
    assert more["flags_digest"] != info["flags_digest"] and "avx512_fp16" in more["isa"]
    assert cpu_facts(block.replace("fpu sse2", "sse2 fpu"))["flags_digest"] == info["flags_digest"]
    assert cpu_facts("")["isa"] == [] and cpu_facts("")["flags_digest"] is None
    assert stack_info()["cpu"] == cpu_facts() or not Path("/proc/cpuinfo").exists()
