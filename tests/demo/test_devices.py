"""The demo's device processes: every way a device can stop is reported with its name, none hangs the demo."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

from peep.lab.demo.devices import DeviceJob, run_devices


def test_a_device_that_fails_is_named_with_its_reason():
    seen: list[tuple[str, str, object]] = []
    result = run_devices(
        [
            DeviceJob("cam-9", "projector", {}),
            DeviceJob(
                "desk-9",
                "desk",
                {},
                {"subjects": [{"subject": "a", "config": {"device": {"id": 7}}, "source": "/nonexistent", "count": 1}]},
            ),
        ],
        lambda *m: seen.append(m),
    )
    expected = "ValueError: device job kind: expected 'camera', 'desk' or 'door', received 'projector'"
    assert result["cam-9"] == {"ok": False, "error": expected}
    assert not result["desk-9"]["ok"] and "ValidationError" in result["desk-9"]["error"]
    assert "device.id" in result["desk-9"]["error"]
    assert seen == []


def test_a_device_process_killed_without_a_word_is_reported_with_its_exit_code():
    box: dict[str, object] = {}
    # A desk with nothing to enrol reports "done" once its imports are over: killed before that.
    runner = threading.Thread(target=lambda: box.update(run_devices([DeviceJob("desk-8", "desk", {}, {"subjects": []})],
                                                                    lambda *m: None)))  # fmt: skip
    runner.start()
    deadline = time.monotonic() + 10

    def ours() -> list:
        # Other tests in this process may have left children of their own (pool workers).
        return [c for c in mp.active_children() if c.name == "peep-demo-desk-8"]

    while not ours() and time.monotonic() < deadline:
        time.sleep(0.005)
    (child,) = ours()
    os.kill(child.pid, signal.SIGKILL)
    runner.join(timeout=20)
    assert not runner.is_alive()
    assert box["desk-8"] == {"ok": False, "error": f"the device process exited with code {-signal.SIGKILL}"}


def test_a_device_with_nothing_to_do_says_done():
    assert run_devices([DeviceJob("desk-7", "desk", {}, {"subjects": []})], lambda *m: None) == {
        "desk-7": {"ok": True, "error": None}
    }
