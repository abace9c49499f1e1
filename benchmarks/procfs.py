"""The benchmarks' /proc readers (Linux): process trees and groups, CPU time, memory per process, and the
machine's available memory. Each reader returns 0 / None / an empty answer for a process that is gone by
the time it is read (processes come and go while a benchmark samples them), never an exception.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/<pid>/stat counts CPU in ticks


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``[0]`` is the state, ``[1]`` the parent
    pid, ``[2]`` the process group, ``[11:15]`` utime stime cutime cstime), None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().decode(errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def children_map() -> dict[int, list[int]]:
    """ppid -> [pid] of every live process."""
    kids: dict[int, list[int]] = {}
    for pid in _pids():
        fields = stat_fields(pid)
        try:
            ppid = int(fields[1]) if fields else None
        except (IndexError, ValueError):
            ppid = None
        if ppid is not None:
            kids.setdefault(ppid, []).append(pid)
    return kids


def process_tree(root: int | None = None) -> list[int]:
    """``root`` (default: this process) and all its descendants."""
    root = root or os.getpid()
    kids = children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def process_groups() -> dict[int, list[tuple[int, int]]]:
    """pgid -> [(pid, ppid)] of every live process."""
    groups: dict[int, list[tuple[int, int]]] = {}
    for pid in _pids():
        if (f := stat_fields(pid)) is not None:
            groups.setdefault(int(f[2]), []).append((pid, int(f[1])))
    return groups


def group_and_descendants(groups: dict[int, list[tuple[int, int]]], leader: int) -> list[tuple[int, int]]:
    """The members of ``leader``'s process group plus every descendant of ``leader`` (stock Flower starts
    the SuperLink's SuperExec, and with it the ServerApp, in a session of its own)."""
    members = {pid: ppid for pid, ppid in groups.get(leader, [])}
    children: dict[int, list[tuple[int, int]]] = {}
    for procs in groups.values():
        for pid, ppid in procs:
            children.setdefault(ppid, []).append((pid, ppid))
    todo = [leader]
    while todo:
        for pid, ppid in children.get(todo.pop(), []):
            if pid not in members:
                members[pid] = ppid
                todo.append(pid)
    return list(members.items())


def cmdline(pid: int) -> str:
    """The command line of ``pid`` with its arguments joined by spaces, '' if gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cpu_seconds(pid: int, children: bool = True) -> float:
    """user + system CPU seconds of ``pid`` (with ``children``: plus its already reaped children), 0 if gone."""
    fields = stat_fields(pid)
    if fields is None:
        return 0.0
    try:
        return sum(int(x) for x in fields[11:15 if children else 13]) / TICKS
    except (IndexError, ValueError):
        return 0.0


def pss_mib(pid: int) -> float:
    """Proportional set size of one process in MiB (shared pages split among their users), 0 if gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def memory_mib(pid: int) -> tuple[float, float, float]:
    """(RSS, PSS, USS) of one process in MiB, zeros if gone. RSS counts shared library pages in full,
    PSS splits them among their users (sums to physical memory), USS counts private pages only (what
    one more such process costs on a machine that already runs one)."""
    vals = {"Rss": 0, "Pss": 0, "Private_Clean": 0, "Private_Dirty": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in vals:
                    vals[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return vals["Rss"] / 1024, vals["Pss"] / 1024, (vals["Private_Clean"] + vals["Private_Dirty"]) / 1024


def mem_available_mib() -> float:
    """The machine's available memory (``MemAvailable`` of /proc/meminfo) in MiB."""
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")
