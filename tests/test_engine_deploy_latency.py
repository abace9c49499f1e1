"""Deployment latency (issue 17 item 4): the tuned launchers (deploy/tuned.py) shorten Flower's object-pull
retries, which made a tuned exchange wait ~3 s when a ClientApp asked for its message a moment early."""

from __future__ import annotations

import pytest


def test_pull_backoff_patch_changes_flowers_defaults_and_only_them():
    from flwr.supercore.inflatable import inflatable_utils as iu

    from deploy.tuned import cap_pull_backoff

    saved = {name: dict(getattr(iu, name).__kwdefaults__) for name in ("pull_objects", "pull_and_inflate_object_from_tree")}
    assert saved["pull_objects"]["initial_backoff"] == 1 and saved["pull_objects"]["backoff_cap"] == 10  # flwr 1.42
    try:
        assert cap_pull_backoff(0.1, 2.0) is True
        for name, before in saved.items():
            now = getattr(iu, name).__kwdefaults__
            assert (now["initial_backoff"], now["backoff_cap"]) == (0.1, 2.0)
            assert {k: v for k, v in now.items() if k not in ("initial_backoff", "backoff_cap")} == {
                k: v for k, v in before.items() if k not in ("initial_backoff", "backoff_cap")}
        with pytest.raises(ValueError, match="0 < initial <= cap"):
            cap_pull_backoff(0.0, 1.0)
    finally:
        for name, before in saved.items():
            getattr(iu, name).__kwdefaults__.update(before)


def test_a_retried_pull_now_waits_the_short_backoff():
    """An object that is missing on the first try is pulled again after ~initial seconds, not ~1 s."""
    import threading
    from unittest import mock

    from flwr.supercore.inflatable import inflatable_utils as iu
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    from deploy.tuned import cap_pull_backoff

    saved = dict(iu.pull_objects.__kwdefaults__)
    tries = {"n": 0}

    def pull(object_id: str) -> bytes:
        tries["n"] += 1
        if tries["n"] == 1:
            raise ObjectUnavailableError(object_id)
        return b"content"

    waits: list[float] = []

    class RecordingEvent(threading.Event):  # what pull_objects waits between tries (no wall-clock budget)
        def wait(self, timeout: float | None = None) -> bool:
            if timeout is None:  # (another user of threading.Event while the patch is on)
                return super().wait()
            waits.append(float(timeout))
            return super().wait(0)

    try:
        cap_pull_backoff(0.05, 2.0)
        with mock.patch.object(iu.threading, "Event", RecordingEvent):
            assert iu.pull_objects(["a"], pull) == {"a": b"content"}
        assert tries["n"] == 2 and len(waits) == 1 and 0.04 <= waits[0] <= 0.06  # 0.05 s +- flwr's 20 % jitter
    finally:
        iu.pull_objects.__kwdefaults__.update(saved)
