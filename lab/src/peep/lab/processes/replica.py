"""``peep serve`` as a subprocess (:class:`Replica`): started, waited for until it logged that it serves,
its JSON log lines collected, stopped with a signal (SIGKILL after a timeout). The cluster bench, the soak and
the tests run replicas with it.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from peep.lab.processes.control import stop_process, wait_for

#: The ``peep`` beside this interpreter.
PEEP = shutil.which("peep", path=str(Path(sys.executable).parent)) or "peep"


class Replica:
    """``peep serve --config <conf>`` as a subprocess (JSON logs on stderr, collected)."""

    def __init__(self, name: str, conf: Path, grpc_port: int, env: dict[str, str], *, mqtt: bool) -> None:
        self.name, self.conf, self.grpc_port, self.env, self.mqtt = name, conf, grpc_port, env, mqtt
        self.proc: subprocess.Popen[str] | None = None
        self.events: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 120.0) -> Replica:
        return self.launch().wait_ready(timeout)

    def launch(self) -> Replica:
        """Start the process without waiting (several replicas start side by side)."""
        self.events = []
        self.proc = subprocess.Popen(
            [PEEP, "serve", "--config", str(self.conf)], stderr=subprocess.PIPE, env=self.env, text=True
        )
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self._reader.start()
        return self

    def wait_ready(self, timeout: float = 120.0) -> Replica:
        """Until it logged ``server started`` (and ``mqtt subscribed`` with MQTT); RuntimeError with its log if not."""
        proc = self.proc
        assert proc is not None
        ready = ("server started", "mqtt subscribed") if self.mqtt else ("server started",)
        if not wait_for(lambda: all(self.seen(e) for e in ready) or proc.poll() is not None, timeout, 0.1):
            raise RuntimeError(f"replica {self.name} did not start in {timeout} s: {self.tail()}")
        if proc.poll() is not None:
            raise RuntimeError(f"replica {self.name} exited with {proc.returncode}: {self.tail()}")
        return self

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line)
            if line.startswith("{"):
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    pass

    def seen(self, event: str) -> bool:
        return any(e.get("event") == event for e in list(self.events))

    def tail(self, n: int = 30) -> str:
        return "".join(self.lines[-n:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Send ``sig`` and wait; SIGKILL after ``timeout``. Returns the exit code (None if not running)."""
        if self.proc is None:
            return None
        stop_process(self.proc, sig, timeout)
        rc = self.proc.returncode
        if self._reader is not None:
            self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        return rc
