"""Mosquitto with the shipped ``deploy/mosquitto`` configuration (:class:`ShippedMosquitto`): the devices' TLS
listener with passwords, ACL and mount point, and the server's listener, on free loopback ports, killable and
restartable on the same ports, its own counts read from $SYS (messages queued for sessions, dropped).
:class:`Mosquitto` is a bare broker on a free port with a configuration of the caller's own (anonymous by default:
what a deployer's open or half-configured broker lets through).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from peep.lab.processes.control import PartUnavailable, checkout_file, port_open, stop_process
from peep.lab.processes.ports import free_port, listens_on

log = logging.getLogger(__name__)

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
#: The shipped broker configuration (a checkout's deploy/mosquitto).
SHIPPED_MOSQUITTO = checkout_file("deploy", "mosquitto")
#: The devices' listener puts their topics under this prefix (deploy/mosquitto/mosquitto.conf).
DEVICE_MOUNT = "devices/"
#: The broker's counts :meth:`ShippedMosquitto.sys_stats` reads (Mosquitto 2.0 publishes them retained under $SYS;
#: the shipped ACL lets ``peep-server`` read ``$SYS/broker/#``).
SYS_TOPICS = {
    "stored": "$SYS/broker/store/messages/count",  # in the store: queued, in flight and retained, each once
    "stored_bytes": "$SYS/broker/store/messages/bytes",
    "retained": "$SYS/broker/retained messages/count",
    "dropped": "$SYS/broker/publish/messages/dropped",  # taken, then dropped (a queue's limits reached)
    "clients_connected": "$SYS/broker/clients/connected",  # a reader's own connection may be among them
    "heap_bytes": "$SYS/broker/heap/current",
}


def mosquitto_missing(shipped: Path = SHIPPED_MOSQUITTO) -> str | None:
    """Why :class:`ShippedMosquitto` cannot run here (None when it can)."""
    for tool in (MOSQUITTO, MOSQUITTO_PASSWD):
        if not os.access(tool, os.X_OK):
            return f"{tool} not installed (Debian package mosquitto)"
    for name in ("mosquitto.conf", "acl", "make-passwd.sh"):
        if not (shipped / name).is_file():
            return f"{shipped / name} not found (the broker runs from a checkout's deploy/mosquitto)"
    return None


def _start_listening(
    workdir: Path,
    conf: Path,
    *,
    listening: Callable[[subprocess.Popen[bytes]], bool],
    may_move: Callable[[], bool],
    move: Callable[[], None],
    timeout: float,
    ports: str,
) -> subprocess.Popen[bytes]:
    """Start mosquitto on ``conf`` and wait until ``listening(proc)``.

    A free port is only free when asked: another process may take it before mosquitto binds it (seen in CI).
    Where ``may_move()`` (before a broker's first start, on ports it chose), such a collision calls ``move()``
    (new ports, the configuration rewritten) and tries again, three times at most; otherwise it is an error.
    """
    stderr = workdir / "stderr.txt"
    log_file = workdir / "mosquitto.log"

    def read_log() -> str:
        return log_file.read_text(errors="replace") if log_file.exists() else ""

    for attempt in range(3):
        err_at = stderr.stat().st_size if stderr.exists() else 0
        log_at = len(read_log())
        with open(stderr, "ab") as err:
            proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                said = stderr.read_text(errors="replace")[err_at:] + read_log()[log_at:]  # the bind error
                if "Address already in use" in said and may_move() and attempt < 2:
                    move()
                    break
                raise RuntimeError(f"mosquitto exited with {proc.returncode}: {said[-2000:]}")
            if listening(proc):
                return proc
            time.sleep(0.05)
        else:
            stop_process(proc, signal.SIGKILL)
            raise RuntimeError(f"mosquitto did not listen on {ports} in {timeout:g} s: {read_log()[-2000:]}")
    raise RuntimeError(f"mosquitto did not start: its ports were taken three times (last {ports})")


class ShippedMosquitto:
    """``mosquitto -c`` the shipped ``deploy/mosquitto/mosquitto.conf``, paths and ports swapped; killable, restartable.

    The shipped ``mosquitto.conf``, ``acl`` and ``make-passwd.sh`` are used as they
    are; only paths and ports are swapped in, and ``persistence_location`` and a
    log file are added (Debian's main configuration sets them). Two TLS listeners
    on 127.0.0.1: :attr:`dev_port` (``mount_point devices/``, device passwords) and
    :attr:`srv_port` (the account ``peep-server``).

    Parameters
    ----------
    workdir : Path
        The broker's folder (created; must not exist yet).
    ca, cert, key : Path
        The CA and the broker's certificate (valid for ``localhost``) and key.
    devices : mapping of str to str
        Device accounts: id -> password.
    server_password : str
        The password of ``peep-server``.
    server_accounts : mapping of str to str, optional
        More accounts on the server's listener, name -> password (``home-assistant``, whose rights the shipped ACL
        names).
    acl_grants : mapping of str to sequence of str, optional
        Lines a deployer adds to the shipped ACL, per account (``{"home-assistant": ["topic write …"]}``).
    sys_interval_s : int, optional
        Mosquitto's ``sys_interval`` (how often $SYS is published; mosquitto's default is 10 s).

    Raises
    ------
    PartUnavailable
        mosquitto, mosquitto_passwd or the shipped files are missing (:func:`mosquitto_missing`).
    """

    def __init__(self, workdir: Path, ca: Path, cert: Path, key: Path, *, devices: Mapping[str, str],
                 server_password: str, server_accounts: Mapping[str, str] | None = None,
                 sys_interval_s: int | None = None, shipped: Path = SHIPPED_MOSQUITTO,
                 acl_grants: Mapping[str, Sequence[str]] | None = None) -> None:  # fmt: skip
        missing = mosquitto_missing(shipped)
        if missing:
            raise PartUnavailable(missing)
        self.workdir = workdir
        self.server_password = server_password
        self._started = False
        etc = workdir / "etc"
        etc.mkdir(parents=True)
        self.creds = workdir / "creds"
        for name, src in (("ca.pem", ca), ("server.pem", cert), ("server.key", key)):
            shutil.copyfile(src, etc / name)
        acl = (shipped / "acl").read_text()
        for user, lines in (acl_grants or {}).items():  # a deployer's added rights, in a section of their own
            acl += f"\nuser {user}\n" + "".join(f"{line}\n" for line in lines)
        (etc / "acl").write_text(acl)
        device_args = [f"{d}={pw}" for d, pw in devices.items()]
        server_args = [f"peep-server={server_password}", *(f"{n}={pw}" for n, pw in (server_accounts or {}).items())]
        for passwd, users in (("passwd", device_args), ("passwd-server", server_args)):
            if not users:
                (etc / passwd).touch(mode=0o600)
                continue
            subprocess.run(
                ["bash", str(shipped / "make-passwd.sh"), str(etc / passwd), str(self.creds), *users],
                check=True,
                capture_output=True,
            )
        self._shipped = (shipped / "mosquitto.conf").read_text().replace("/etc/mosquitto/peep/", f"{etc}/")
        self._sys_interval_s = sys_interval_s
        self.conf = workdir / "mosquitto.conf"
        self._listen_on(free_port(), free_port())
        self.ca = etc / "ca.pem"
        self.proc: subprocess.Popen[bytes] | None = None

    def _listen_on(self, dev_port: int, srv_port: int) -> None:
        self.dev_port, self.srv_port = dev_port, srv_port
        conf, n_dev = re.subn(r"^listener 8883$", f"listener {dev_port} 127.0.0.1", self._shipped, flags=re.M)
        conf, n_srv = re.subn(r"^listener 8884$", f"listener {srv_port} 127.0.0.1", conf, flags=re.M)
        if not n_dev == n_srv == 1:
            raise RuntimeError("deploy/mosquitto/mosquitto.conf: expected one 'listener 8883' and one 'listener 8884'")
        w = self.workdir
        head = [f"persistence_location {w}/", f"log_dest file {w}/mosquitto.log", "log_type all"]
        if self._sys_interval_s is not None:
            head.append(f"sys_interval {int(self._sys_interval_s)}")
        if os.geteuid() == 0:
            head.append("user root")  # as root mosquitto would drop to `mosquitto`, which cannot read tmp dirs
        self.conf.write_text("\n".join(head) + "\n" + conf)

    def start(self, timeout: float = 10.0) -> Self:
        """Start the broker and wait until both listeners accept connections.

        A free port is only free when asked: another process may take it before
        mosquitto binds it (seen once in CI). Before the first successful start,
        such a collision picks new ports; after it, a restart must keep the ports
        the clients know, and a collision is an error.
        """
        self.proc = _start_listening(
            self.workdir, self.conf, timeout=timeout, ports=f"{self.dev_port} and {self.srv_port}",
            listening=lambda proc: port_open(self.dev_port) and port_open(self.srv_port),
            may_move=lambda: not self._started, move=lambda: self._listen_on(free_port(), free_port()),
        )  # fmt: skip
        self._started = True
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` and wait (SIGKILL after 10 s). SIGTERM saves the store (sessions, queues); SIGKILL
        loses what arrived since the last autosave (the shipped ``autosave_interval``)."""
        stop_process(self.proc, sig)
        self.proc = None

    def restart(self, sig: int = signal.SIGTERM) -> Self:
        """:meth:`stop` with ``sig``, then :meth:`start` on the same ports."""
        self.stop(sig)
        return self.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def log(self) -> str:
        p = self.workdir / "mosquitto.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def server_mqtt_section(self, *, password: str = "env:PEEP_MQTT_PASSWORD", **overrides: Any) -> dict[str, Any]:
        """``server.toml``'s ``[mqtt]`` for this broker as ``peep-server`` (``password``: a value or reference)."""
        sec: dict[str, Any] = {
            "enabled": True,
            "host": "localhost",
            "port": self.srv_port,
            "username": "peep-server",
            "password": password,
            "device_mount_point": DEVICE_MOUNT,
            "topic_prefix": "peep/v1",  # the root the shipped ACL names
            "tls": {"ca": str(self.ca)},
        }
        sec.update(overrides)
        return sec

    def sys_stats(self, timeout: float = 5.0) -> dict[str, int] | None:
        """The broker's own counts (:data:`SYS_TOPICS`) from its retained $SYS topics, read as ``peep-server``.

        A short-lived client subscribes and takes the retained values. Mosquitto
        publishes them every ``sys_interval`` seconds (10 by default; seen up to about
        two intervals late), so a reading lags the broker by that much. Counts not
        received within ``timeout`` are left out; None when the broker is down or
        refuses the connection.
        """
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        names = {topic: name for name, topic in SYS_TOPICS.items()}
        got: dict[str, int] = {}
        done = threading.Event()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="", protocol=mqtt.MQTTv5)
        c.username_pw_set("peep-server", self.server_password)
        c.tls_set(ca_certs=str(self.ca))
        refused: list[bool] = []

        def on_connect(cl: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
            if rc.is_failure:
                refused.append(True)
                done.set()
            else:
                cl.subscribe([(t, 0) for t in SYS_TOPICS.values()])

        def on_message(cl: Any, u: Any, m: Any) -> None:
            with contextlib.suppress(ValueError):
                got[names[m.topic]] = int(float(m.payload))
            if len(got) == len(SYS_TOPICS):
                done.set()

        c.on_connect, c.on_message = on_connect, on_message
        try:
            c.connect("localhost", self.srv_port, keepalive=10)
        except OSError:
            return None
        c.loop_start()
        try:
            done.wait(timeout)
        finally:
            c.disconnect()
            c.loop_stop()
        return None if refused or not got else dict(got)

    def queue_depth(self, timeout: float = 5.0) -> int | None:
        """Messages the broker holds besides retained ones: queued for sessions or in flight (see :meth:`sys_stats`).

        ``stored - retained`` of :meth:`sys_stats`: each stored message counts once
        however many sessions queue it (there is no per-session queue length under
        $SYS); the broker's own retained $SYS topics make both counts move by a few
        between readings. None when the broker does not answer.
        """
        stats = self.sys_stats(timeout)
        if stats is None or "stored" not in stats or "retained" not in stats:
            return None
        return max(0, stats["stored"] - stats["retained"])


class Mosquitto:
    """A bare mosquitto on a free port with a configuration of the caller's own (anonymous by default), killable
    and restartable; :class:`PartUnavailable` where mosquitto is not installed."""

    def __init__(
        self, workdir: Path, conf_body: str = "", *, port: int | None = None, persistence: bool = True
    ) -> None:
        if not os.access(MOSQUITTO, os.X_OK):
            raise PartUnavailable(f"{MOSQUITTO} not installed (Debian package mosquitto)")
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._chosen_port = port is None  # a port of ours may be replaced if taken before the first start
        self._conf_body = conf_body
        self._persistence = persistence
        self._started = False
        self.conf = workdir / "mosquitto.conf"
        self._listen_on(port or free_port())
        self.proc: subprocess.Popen[bytes] | None = None

    def _listen_on(self, port: int) -> None:
        self.port = port
        workdir, conf_body, persistence = self.workdir, self._conf_body, self._persistence
        lines = [f"listener {self.port} 127.0.0.1"] if "listener" not in conf_body else []
        if "allow_anonymous" not in conf_body:
            lines.append("allow_anonymous true")
        if persistence:
            lines += ["persistence true", f"persistence_location {workdir}/", "autosave_interval 1"]
        lines += [f"log_dest file {workdir}/mosquitto.log", "log_type all"]
        if os.geteuid() == 0:
            # As root mosquitto drops to the `mosquitto` user, which cannot read pytest's tmp dirs.
            lines.append("user root")
        self._written = "\n".join(lines) + "\n" + conf_body.replace("{port}", str(self.port)) + "\n"
        self.conf.write_text(self._written)

    def start(self) -> Mosquitto:
        """Start mosquitto and wait for its listener.

        Before the first successful start, a port this broker chose itself and
        another process took meanwhile is replaced; a restart keeps the port.
        """

        def ours() -> bool:  # a port it chose, in the configuration it wrote (a test may rewrite it), never started
            return self._chosen_port and self.conf.read_text() == self._written and not self._started

        self.proc = _start_listening(
            self.workdir, self.conf, timeout=10.0, ports=str(self.port),
            listening=lambda proc: listens_on(proc.pid, self.port),  # its own listener, not a squatter's
            may_move=ours, move=lambda: self._listen_on(free_port()),
        )  # fmt: skip
        self._started = True
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` and wait (SIGKILL after 10 s)."""
        stop_process(self.proc, sig)
        self.proc = None

    def log(self) -> str:
        p = self.workdir / "mosquitto.log"
        return p.read_text(errors="replace") if p.exists() else ""
