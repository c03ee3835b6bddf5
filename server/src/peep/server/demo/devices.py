"""The demo's devices, each in a process of its own, as on its own hardware.

A camera or an enrolment desk runs the real edge agent (:class:`peep.edge.agent.Agent`) in a spawned
process: dlib holds the GIL while it describes a face, so agents sharing the demo's process took turns
on one core. Each process reports on one queue what the demo needs and nothing more: per release, the
message id, the frame and the track (with the payload, which the demo's verification claims replay), per
enrolled subject one tick, and at the end the agent's suppression count or the error that stopped it.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# How long a device may stay silent before the demo checks that its process is still alive.
_POLL_S = 0.5


@dataclass
class DeviceJob:
    """What one device process runs.

    ``kind`` is ``"camera"`` (``work`` = ``{"config": ..., "video": path}``) or ``"desk"`` (``work`` =
    ``{"subjects": [{"subject": ..., "config": ..., "source": folder, "count": n}, ...]}``); configurations
    are :class:`peep.edge.config.EdgeConfig` dictionaries, ``environ`` holds the device's token.
    """

    device_id: str
    kind: str
    environ: dict[str, str]
    work: dict[str, Any] = field(default_factory=dict)


def _suppressed(agent: Any) -> float:
    total = 0.0
    for metric in agent.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "peep_edge_suppressed_total":
                total += sample.value
    return total


def _device_main(job: DeviceJob, out: Any) -> None:
    """A device process: run ``job``, then say ``done`` (or ``error``) on ``out``."""
    from peep.edge.agent import Agent
    from peep.edge.capture import VideoSource
    from peep.edge.config import EdgeConfig
    from peep.edge.logs import setup_logging

    setup_logging(level="warning", fmt="text")
    try:
        if job.kind == "camera":

            def on_release(rel: Any, frame: Any) -> None:
                out.put(("release", job.device_id, (rel.message_id, frame.index, rel.track_id, rel.payload)))

            agent = Agent(EdgeConfig.model_validate(job.work["config"]), environ=job.environ, on_release=on_release)
            agent.run(source=VideoSource(job.work["video"], kind="file"))
            out.put(("done", job.device_id, {"suppressed": _suppressed(agent)}))
        elif job.kind == "desk":
            for item in job.work["subjects"]:
                agent = Agent(EdgeConfig.model_validate(item["config"]), environ=job.environ)
                agent.enroll(subject=item["subject"], source=item["source"], count=item["count"], timeout_s=60.0)
                out.put(("enrolled", job.device_id, item["subject"]))
            out.put(("done", job.device_id, {}))
        else:
            raise ValueError(f"device job kind: expected 'camera' or 'desk', received {job.kind!r}")
    except BaseException as exc:  # reported to the demo, which names the device
        out.put(("error", job.device_id, f"{type(exc).__name__}: {exc}"))


def run_devices(jobs: list[DeviceJob], on_message: Callable[[str, str, Any], None]) -> dict[str, dict[str, Any]]:
    """Run every job in its own spawned process; ``on_message(kind, device_id, value)`` as they report.

    Returns
    -------
    dict
        Per device: ``{"ok": bool, "error": str | None, **what its ``done`` message carried}``. A process
        that dies without a word (killed, crashed in native code) is reported with its exit code.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = {j.device_id: ctx.Process(target=_device_main, args=(j, out), name=f"peep-demo-{j.device_id}", daemon=True)
             for j in jobs}  # fmt: skip
    result: dict[str, dict[str, Any]] = {}
    for p in procs.values():
        p.start()
    try:
        while len(result) < len(procs):
            try:
                kind, device, value = out.get(timeout=_POLL_S)
            except queue.Empty:
                for device, p in procs.items():
                    if device not in result and not p.is_alive():
                        # Its last words may still be in the pipe: one more look before calling it dead.
                        try:
                            kind, device2, value = out.get(timeout=_POLL_S)
                        except queue.Empty:
                            result[device] = {"ok": False, "error": f"the device process exited with code {p.exitcode}"}
                            continue
                        _record(result, kind, device2, value, on_message)
                continue
            _record(result, kind, device, value, on_message)
    finally:
        for p in procs.values():
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
        out.close()
    return result


def _record(
    result: dict[str, dict[str, Any]], kind: str, device: str, value: Any, on_message: Callable[[str, str, Any], None]
) -> None:
    if kind == "done":
        result[device] = {"ok": True, "error": None, **value}
    elif kind == "error":
        result[device] = {"ok": False, "error": value}
    else:
        on_message(kind, device, value)
