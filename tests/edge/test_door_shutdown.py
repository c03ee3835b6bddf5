"""A door stops within 5 s of SIGTERM whatever the server does, as its systemd unit promises.

A frozen server (SIGSTOP, or one too loaded to answer) still completes TCP handshakes in the kernel: a
socket that listens and never accepts is that server, seen from the door. The door is asked a claim (its
claim check waits on the server), then stopped; its last report to the server must not hold the stop.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from peep_testing.broker import wait_for

pytestmark = pytest.mark.processes

#: The unit's promise (deploy/systemd/peep-edge-door.service): the lock released and the process gone.
STOP_WITHIN_S = 5.0


@pytest.mark.parametrize("state", ["idle", "claim"])
def test_sigterm_ends_the_door_within_5_s_while_the_server_accepts_connections_and_never_answers(
    make_config, tmp_path: Path, one_person_video, state: str
):
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(64)  # never accepted: every connection completes its handshake and then hears nothing
    log = tmp_path / "lock.log"
    script = f"import sys; open({str(log)!r}, 'a').write(sys.argv[1] + '\\n')"
    door = {"enabled": True, "decision": "grpc", "lock": "command",
            "open_command": [sys.executable, "-c", script, "open"],
            "close_command": [sys.executable, "-c", script, "locked"]}  # fmt: skip
    # Reports on: the last one at the stop goes to the frozen server (and is what once held the stop 15.6 s).
    cfg = make_config("door.toml", privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e6},
                      capture={"source": one_person_video["path"], "max_fps": 10.0}, mqtt={"enabled": False},
                      grpc={"enabled": True, "target": f"127.0.0.1:{frozen.getsockname()[1]}", "tls": False,
                            "report_interval_s": 60.0, "deadline_s": 30.0},
                      door=door)  # fmt: skip
    cmd = [sys.executable, "-m", "peep.edge.cli", "door", "--config", str(cfg), "--claims", "-"]
    try:
        with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            try:
                assert wait_for(lambda: log.exists() and "locked" in log.read_text(), 60), "the door did not start"
                time.sleep(1.0)  # its first report is on its way to the server, and waits
                if state == "claim":
                    proc.stdin.write(b"alice\n")  # its claim check waits on the server
                    proc.stdin.flush()
                    time.sleep(1.0)
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                rc = proc.wait(timeout=30)
                took = time.monotonic() - t0
            finally:
                if proc.poll() is None:
                    proc.kill()
                stdout, stderr = proc.communicate()
    finally:
        frozen.close()
    out = stdout.decode()
    print(f"SIGTERM while {state}, the server frozen: exited {rc} after {took:.2f} s")
    assert rc == 0 and took < STOP_WITHIN_S, (rc, took, out, stderr.decode()[-3000:])
    assert log.read_text().split() == ["locked", "locked"]  # locked at start, released on the way out
    assert "stopped after 0 opening(s)" in out
    if state == "claim":
        assert re.search(r"claim alice: locked \((unreachable|timeout)\)", out), out
