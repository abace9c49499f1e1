#!/usr/bin/env python
"""Checks deploy/superlink.sh runs before it starts the SuperLink: where it may listen, and that its state is private.

    python deploy/state_guard.py host 127.0.0.1          # exit 0: a loopback IP literal; 2 otherwise
    python deploy/state_guard.py state /state/superlink.db   # make the database's folder 0700 and the file 0600

``host`` accepts only IP literals in 127.0.0.0/8 or ``::1`` (parsed with :mod:`ipaddress`, so
``127.evil.example`` or ``localhost``, which a resolver could map anywhere, are refused).
``state`` creates the database's folder with mode 0700 (or tightens it to 0700 when this user owns it) and
tightens an existing database file and its SQLite side files (``-wal``, ``-shm``, ``-journal``) to 0600; a
folder this user does not own that others can read is refused (use a subfolder, e.g. ``/state/superlink/``).
The SuperLink itself runs under ``umask 077``, so the files it creates later are 0600 too.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import sys
from pathlib import Path

SIDE_FILES = ("", "-wal", "-shm", "-journal")


def is_loopback_literal(host: str) -> bool:
    """True only for an IPv4 address in 127.0.0.0/8 or the IPv6 loopback, written as an IP literal."""
    try:
        return ipaddress.ip_address(host.strip("[]") if host.startswith("[") else host).is_loopback
    except ValueError:
        return False


def secure_state(database: Path) -> list[str]:
    """Make ``database``'s folder 0700 and the database files 0600; returns what was changed.

    Raises PermissionError naming the folder when it is readable by others and not ours to tighten."""
    folder = database.parent
    changed: list[str] = []
    if not folder.exists():
        folder.mkdir(mode=0o700, parents=True)
        folder.chmod(0o700)  # mkdir's mode is filtered by the umask
        changed.append(f"created {folder} 0700")
    st = folder.stat()
    if stat.S_IMODE(st.st_mode) & 0o077:
        if st.st_uid != os.geteuid():
            raise PermissionError(
                f"{folder} (the DATABASE folder) is accessible to group/others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}) and owned by uid {st.st_uid}, not this user: the SuperLink's "
                f"state would not be private. Use a subfolder this user creates, e.g. {folder / 'superlink'}/")
        folder.chmod(0o700)
        changed.append(f"{folder} -> 0700")
    for suffix in SIDE_FILES:
        path = Path(f"{database}{suffix}")
        if path.exists() and stat.S_IMODE(path.stat().st_mode) != 0o600:
            path.chmod(0o600)
            changed.append(f"{path} -> 0600")
    return changed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("host", "state"):
        print("usage: state_guard.py host ADDRESS | state DATABASE", file=sys.stderr)
        return 2
    if args[0] == "host":
        return 0 if is_loopback_literal(args[1]) else 2
    try:
        for line in secure_state(Path(args[1]).expanduser().absolute()):
            print(f"superlink.sh: {line}", file=sys.stderr)
    except (PermissionError, OSError) as exc:
        print(f"superlink.sh: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
