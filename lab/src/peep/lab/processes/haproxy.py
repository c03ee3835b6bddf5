"""HAProxy in front of ``peep serve`` replicas, run from the shipped ``deploy/cluster/haproxy.cfg``.

:class:`Balancer` is what the ``cluster`` section of ``peep bench``, the soak and the balancer tests put in
front of their replicas: the shipped configuration with its paths and addresses swapped for a run's.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from peep.lab.processes.control import stop_process, wait_for
from peep.lab.processes.ports import free_port, listens_on
from peep.lab.processes.sockets import HAPROXY_SOCKET_MAX, SocketPlace

__all__ = ["HAPROXY", "SHIPPED_HAPROXY", "Balancer", "haproxy_missing"]

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
#: The shipped configuration (a checkout's deploy/cluster/haproxy.cfg).
SHIPPED_HAPROXY = Path(__file__).resolve().parents[5] / "deploy" / "cluster" / "haproxy.cfg"


def haproxy_missing() -> str | None:
    """Why the balancer cannot run here (None when it can)."""
    if not os.access(HAPROXY, os.X_OK):
        return f"{HAPROXY} not installed (Debian's haproxy; scripts/bootstrap.sh installs it)"
    if not SHIPPED_HAPROXY.is_file():
        return f"{SHIPPED_HAPROXY} not found (the balancer runs from a checkout's deploy/cluster)"
    return None


_FRONT_PORT = "@PORT@"  # the frontend's port in the written haproxy.cfg, swapped per start


class Balancer:
    """HAProxy with the shipped ``deploy/cluster/haproxy.cfg``, its paths and addresses swapped for a run's.

    Parameters
    ----------
    workdir : Path
    cert, key, ca : Path
        The frontend's certificate and key (the site's server certificate) and the CA that signed the replicas'.
    replicas : list of (name, grpc_port, metrics_port)
        On 127.0.0.1; their certificates must be valid for ``host_name``.
    """

    def __init__(self, workdir: Path, *, cert: Path, key: Path, ca: Path, replicas: Sequence[tuple[str, int, int]],
                 host_name: str = "localhost", shipped: Path = SHIPPED_HAPROXY) -> None:  # fmt: skip
        import re

        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir, self.port = workdir, free_port()
        # HAProxy refuses a deep folder's socket path: then a short folder of its own, removed by stop().
        self._socket = SocketPlace(workdir, "admin.sock", limit=HAPROXY_SOCKET_MAX, prefix="peep-haproxy-")
        self.socket = self._socket.path
        pem = workdir / "front.pem"
        pem.write_text(cert.read_text() + key.read_text())
        pem.chmod(0o600)
        text = shipped.read_text()
        swaps = [
            (r"^    log /dev/log local0 info$", "    log stdout format raw local0 info"),
            (r"/run/haproxy/peep-admin\.sock", str(self.socket)),
            (
                r"^    bind :50051 ssl crt /etc/haproxy/peep/front\.pem",
                f"    bind 127.0.0.1:{_FRONT_PORT} ssl crt {pem}",
            ),
            (r"/etc/haproxy/peep/ca\.pem", str(ca)),
            (r"peep-replicas\.internal", host_name),
        ]
        for pattern, repl in swaps:
            text, n = re.subn(pattern, repl, text, flags=re.M)
            if n == 0:
                raise RuntimeError(f"{shipped}: expected {pattern!r}, which the balancer's harness swaps")
        text, n = re.subn(r"^    server replica-.*\n", "", text, flags=re.M)
        if n == 0:
            raise RuntimeError(f"{shipped}: expected the replicas' server lines")
        text += "".join(f"    server {name} 127.0.0.1:{gp} check port {mp}\n" for name, gp, mp in replicas)
        self.conf = workdir / "haproxy.cfg"
        self._template = text
        self._listen_on(self.port)
        self._started = False
        self.proc: subprocess.Popen[bytes] | None = None

    def _listen_on(self, port: int) -> None:
        self.port = port
        self.conf.write_text(self._template.replace(_FRONT_PORT, str(port)))

    def start(self, timeout: float = 10.0) -> Balancer:
        """Start HAProxy and wait until its frontend accepts connections.

        A free port is only free when asked: before the first successful start a
        port taken meanwhile is replaced by a new one; a restart keeps the port
        the clients know, and a collision then is an error.
        """
        self._socket.make()  # started again after stop() removed its folder

        def listening() -> bool:
            return self.proc is not None and listens_on(self.proc.pid, self.port)

        for attempt in range(3):
            log_at = len(self.log())
            with open(self.workdir / "haproxy.log", "ab") as log:
                self.proc = subprocess.Popen([HAPROXY, "-f", str(self.conf), "-db"], stdout=log,
                                             stderr=subprocess.STDOUT)  # fmt: skip
            if not wait_for(lambda: listening() or (self.proc is not None and self.proc.poll() is not None), timeout):
                stop_process(self.proc, signal.SIGKILL)
                raise RuntimeError(f"haproxy did not listen within {timeout} s: {self.log()[-2000:]}")
            if self.proc.poll() is None:
                self._started = True
                return self
            said = self.log()[log_at:]
            if "cannot bind socket" in said and not self._started and attempt < 2:
                self._listen_on(free_port())
                continue
            raise RuntimeError(f"haproxy exited with {self.proc.returncode}: {said[-2000:]}")
        raise RuntimeError("haproxy did not start: its port was taken three times")

    def log(self) -> str:
        p = self.workdir / "haproxy.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stats(self) -> dict[str, dict[str, str]]:
        """Each replica's line of the balancer's ``show stat`` (its stats socket), by server name."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.socket))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        lines = data.decode(errors="replace").splitlines()
        header = lines[0].lstrip("# ").split(",") if lines else []
        out = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("svname") not in (None, "", "FRONTEND", "BACKEND"):
                out[row["svname"]] = row
        return out

    def servers(self) -> dict[str, str]:
        """Each replica's state as the balancer sees it (``UP``, ``DOWN``, ``UP 1/2`` ...)."""
        return {name: row.get("status", "") for name, row in self.stats().items()}

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
        self._socket.remove()
