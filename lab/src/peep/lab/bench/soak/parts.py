"""The real parts a soak runs and breaks: PostgreSQL, the shipped Mosquitto, a cuttable TCP path, /proc readings.

:class:`PostgresCluster`
    A PostgreSQL cluster of the run's own (``initdb`` in a temporary folder, trust
    authentication on 127.0.0.1, a free port): started, stopped ``fast`` or
    ``immediate`` (a crash: recovery from the WAL on the next start), its tables'
    sizes read.
:class:`ShippedMosquitto`
    Mosquitto with the shipped ``deploy/mosquitto`` configuration (the devices'
    TLS listener with passwords, ACL and mount point; the server's listener) on
    free loopback ports, killable and restartable on the same ports, its own
    counts read from $SYS (messages queued for sessions, dropped).
:class:`TcpProxy`
    A thread-based TCP proxy on 127.0.0.1 whose :meth:`~TcpProxy.cut` drops every
    connection and refuses new ones until :meth:`~TcpProxy.heal`: a camera's
    network path to the broker or the balancer.
:class:`ProcessStats`
    Resident memory, open files, threads and CPU time of a process, from ``/proc``.

A camera's own machine's faults (a full state disk, a stepped wall clock) are
:class:`~peep.lab.bench.soak.edgefaults.LimitedFolder` and
:class:`~peep.lab.bench.soak.edgefaults.SteppedClock`.

The replicas and the balancer are :class:`~peep.lab.bench.cluster.Replica`
and :class:`~peep.lab.bench.balancer.Balancer`. ``tests/server`` uses
:class:`ShippedMosquitto` for its broker tests too (``tests/lib/peep_testing/broker.py``).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from peep.lab.bench.ports import free_port
from peep.lab.bench.processes import stop_process

log = logging.getLogger(__name__)


class PartUnavailable(RuntimeError):
    """A part cannot run on this machine: a tool is missing or cannot be used (the message names which)."""


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _checkout_file(*parts: str) -> Path:
    # parts.py sits at <checkout>/lab/src/peep/lab/bench/soak/.
    return Path(__file__).resolve().parents[6].joinpath(*parts)


def unit_environment(unit: str, systemd: Path | None = None) -> dict[str, str]:
    """The ``Environment=`` a shipped systemd unit (``deploy/systemd/<unit>``) gives its process.

    The soak runs each process as a deployment does: the allocator's arenas and the maths libraries' threads
    set as the unit sets them (a process run without ``MALLOC_ARENA_MAX`` grows in ways a deployed one does
    not, and the other way round).

    Raises
    ------
    PartUnavailable
        The unit is not in the checkout, or an assignment is not ``KEY=VALUE``.
    """
    path = (systemd or _checkout_file("deploy", "systemd")) / unit
    if not path.is_file():
        raise PartUnavailable(f"{path} not found (the soak runs its processes as deploy/systemd's units do)")
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("Environment="):
            continue
        for word in shlex.split(line[len("Environment=") :]):
            key, eq, value = word.partition("=")
            if not eq or not key.isidentifier():
                raise PartUnavailable(f"{path}: Environment= expected KEY=VALUE, received {word[:80]!r}")
            env[key] = value
    return env


# --------------------------------------------------------------------------- PostgreSQL

#: The stop modes of ``pg_ctl stop -m``.
PG_STOP_MODES = ("smart", "fast", "immediate")
# The socket path (folder + "/.s.PGSQL.<port>") must fit sun_path's 108 bytes.
_MAX_SOCKET_DIR = 90


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _postgres_bindir(bindir: str | os.PathLike[str] | None) -> Path:
    """The folder holding ``initdb`` and ``pg_ctl``: ``bindir``, else PATH, else Debian's newest."""
    if bindir is not None:
        candidates = [Path(bindir)]
    else:
        on_path = shutil.which("initdb")
        candidates = [Path(on_path).parent] if on_path else []
        debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(re.sub(r"\D", "", p) or 0))
        candidates += [Path(p) for p in reversed(debian)]
    for d in candidates:
        if all(os.access(d / tool, os.X_OK) for tool in ("initdb", "pg_ctl")):
            return d
    where = str(bindir) if bindir is not None else "PATH and /usr/lib/postgresql/*/bin"
    raise PartUnavailable(
        f"PostgreSQL's initdb and pg_ctl not found in {where} (Debian: apt-get install postgresql; or pass bindir=)"
    )


class PostgresCluster:
    """A PostgreSQL cluster of its own: ``initdb`` in a temporary folder, trust authentication on 127.0.0.1.

    The cluster is created on the first :meth:`start`. PostgreSQL refuses to run
    as root: as root, ``initdb`` and ``pg_ctl`` run as ``os_user`` (``runuser``)
    and the folder is theirs. The folder is made in ``workdir`` when ``os_user``
    can reach it and its socket path is short enough, else in the system's
    temporary folder (:attr:`folder` says where); :meth:`cleanup` removes it.

    Parameters
    ----------
    workdir : Path
        Where the run keeps its files.
    bindir : path, optional
        The folder of ``initdb`` and ``pg_ctl`` (default: on PATH, else Debian's newest).
    os_user : str
        The account PostgreSQL runs as when this process is root.
    settings : mapping of str to str, optional
        Server settings for ``postgres -c`` (e.g. ``{"fsync": "off"}``; none by default).

    Raises
    ------
    PartUnavailable
        ``initdb``/``pg_ctl`` not found, or root without ``os_user`` or ``runuser``.

    Examples
    --------
    >>> pg = PostgresCluster(workdir).start()          # doctest: +SKIP
    >>> psycopg.connect(pg.dsn)                         # doctest: +SKIP
    >>> pg.stop("immediate"); pg.start(); pg.cleanup()  # doctest: +SKIP
    """

    def __init__(self, workdir: Path, *, bindir: str | os.PathLike[str] | None = None, os_user: str = "postgres",
                 settings: Mapping[str, str] | None = None) -> None:  # fmt: skip
        self.bindir = _postgres_bindir(bindir)
        self._as: list[str] = []
        self._owner: tuple[int, int] | None = None
        if os.geteuid() == 0:
            import pwd

            try:
                entry = pwd.getpwnam(os_user)
            except KeyError:
                raise PartUnavailable(
                    f"PostgreSQL refuses to run as root and there is no user {os_user!r} to run it as "
                    "(os_user=; Debian's postgresql package creates 'postgres')"
                ) from None
            runuser = shutil.which("runuser")
            if runuser is None:
                raise PartUnavailable("PostgreSQL refuses to run as root and runuser (util-linux) is not installed")
            self._as = [runuser, "-u", os_user, "--"]
            self._owner = (entry.pw_uid, entry.pw_gid)
        self.settings = dict(settings or {})
        self.folder = self._make_folder(Path(workdir))
        self.data = self.folder / "data"
        self.logfile = self.folder / "postgres.log"
        self.port = free_port()
        self._initialised = False
        self._started = False

    # ------------------------------------------------------------ the folder

    def _make_folder(self, workdir: Path) -> Path:
        workdir.mkdir(parents=True, exist_ok=True)
        for base in (workdir, Path(tempfile.gettempdir())):
            if len(str(base)) > _MAX_SOCKET_DIR - 24:
                continue
            folder = Path(tempfile.mkdtemp(prefix="peep-soak-pg-", dir=base))
            if self._owner is None:
                return folder
            os.chown(folder, *self._owner)
            # root may traverse what os_user cannot (a 0700 test folder): ask as os_user.
            if subprocess.run([*self._as, "test", "-w", str(folder)], capture_output=True).returncode == 0:
                return folder
            folder.rmdir()
            log.info("soak: PostgreSQL's user cannot reach %s; its cluster goes to the system temp folder", base)
        raise PartUnavailable(
            f"no folder for PostgreSQL: {workdir} is not writable by its user or its path is too long for a socket, "
            f"and neither is {tempfile.gettempdir()}"
        )

    def _run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        # cwd: os_user may not be allowed into this process's working directory, and the tools chdir back to it.
        return subprocess.run([*self._as, *args], cwd=self.folder, capture_output=True, text=True, timeout=timeout)

    def _initdb(self) -> None:
        # --no-sync: the files are new and a failure here means starting over; durability tests crash
        # PostgreSQL (stop "immediate"), not the machine.
        r = self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                      "-E", "UTF8", "--locale=C", "--no-sync", timeout=120)  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"initdb -D {self.data} failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")
        self._initialised = True

    # ------------------------------------------------------------ running it

    @property
    def dsn(self) -> str:
        """A libpq connection string for the ``postgres`` database as the superuser ``postgres``."""
        return f"host=127.0.0.1 port={self.port} dbname=postgres user=postgres connect_timeout=3"

    def start(self, timeout: float = 60.0) -> Self:
        """Start the cluster (``initdb`` first if new) and wait until it accepts connections.

        Before the first successful start, a port taken in the meantime is replaced (three tries); after
        it, a restart keeps the port its clients know. After the postmaster was killed outright, the start
        is tried again (until ``timeout``) while its old processes still hold its shared memory.

        Raises
        ------
        RuntimeError
            ``pg_ctl start`` failed or timed out (its log's end in the message).
        """
        if not self._initialised:
            self._initdb()
        deadline = time.monotonic() + timeout
        port_tries = 0
        while True:
            at = len(self.log())
            # pg_ctl runs postgres through a shell: -o is one quoted string.
            opts = [f"-p {self.port}", f"-k {shlex.quote(str(self.folder))}", "-c listen_addresses=127.0.0.1"]
            opts += [f"-c {shlex.quote(f'{k}={v}')}" for k, v in self.settings.items()]
            left = max(1.0, deadline - time.monotonic())
            r = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile), "-o",
                          " ".join(opts), "-w", "-t", str(int(left)), "start", timeout=left + 10)  # fmt: skip
            if r.returncode == 0:
                self._started = True
                return self
            said = self.log()[at:]
            if "could not bind" in said and not self._started and port_tries < 2:
                port_tries += 1
                self.port = free_port()
                continue
            if "pre-existing shared memory block" in said and time.monotonic() < deadline:
                # After the postmaster was killed, its children hold its shared memory until they notice and exit.
                time.sleep(0.5)
                continue
            raise RuntimeError(f"pg_ctl start on port {self.port} failed ({r.returncode}): {r.stderr} {said[-2000:]}")

    def stop(self, mode: str = "fast", timeout: float = 60.0) -> None:
        """``pg_ctl stop -m mode``: ``fast`` (clients disconnected, a clean shutdown) or ``immediate`` (a crash:
        no checkpoint, the next start recovers from the WAL); ``smart`` waits for clients to leave.
        Nothing happens when it is not running."""
        if mode not in PG_STOP_MODES:
            raise ValueError(f"mode: expected one of {PG_STOP_MODES}, received {mode!r}")
        if not self._initialised or not (self.data / "postmaster.pid").exists():
            return
        r = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                      "-t", str(int(max(1, timeout))), "stop", timeout=timeout + 10)  # fmt: skip
        # A postmaster killed outright leaves its pid file behind: pg_ctl cannot signal it, the next start
        # sees the file is stale. Stopped either way.
        if r.returncode != 0 and self.pid is not None and _running(self.pid):
            raise RuntimeError(f"pg_ctl stop -m {mode} failed ({r.returncode}): {r.stderr} {self.log()[-2000:]}")

    def restart(self, mode: str = "fast", timeout: float = 60.0) -> Self:
        """:meth:`stop` with ``mode``, then :meth:`start` on the same port."""
        self.stop(mode, timeout)
        return self.start(timeout)

    @property
    def pid(self) -> int | None:
        """The postmaster's process id (None when it is not running)."""
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except (FileNotFoundError, PermissionError):
            return None
        return int(first) if first.strip().isdigit() else None

    def alive(self, timeout: float = 2.0) -> bool:
        """Whether the cluster answers a query within ``timeout`` seconds."""
        import psycopg

        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(1, int(timeout))) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def table_sizes(self, schema: str = "public") -> dict[str, int]:
        """Bytes on disk (``pg_total_relation_size``: heap, indexes and TOAST) of each table in ``schema``."""
        import psycopg

        q = (
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY c.relname"
        )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return {str(name): int(size) for name, size in conn.execute(q, (schema,))}

    def log(self) -> str:
        """The server's log so far."""
        try:
            return self.logfile.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def cleanup(self) -> None:
        """Stop the cluster (``immediate``: it is being thrown away) and remove its folder."""
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


# --------------------------------------------------------------------------- Mosquitto

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
#: The shipped broker configuration (a checkout's deploy/mosquitto).
SHIPPED_MOSQUITTO = _checkout_file("deploy", "mosquitto")
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
    sys_interval_s : int, optional
        Mosquitto's ``sys_interval`` (how often $SYS is published; mosquitto's default is 10 s).

    Raises
    ------
    PartUnavailable
        mosquitto, mosquitto_passwd or the shipped files are missing (:func:`mosquitto_missing`).
    """

    def __init__(self, workdir: Path, ca: Path, cert: Path, key: Path, *, devices: Mapping[str, str],
                 server_password: str, sys_interval_s: int | None = None,
                 shipped: Path = SHIPPED_MOSQUITTO) -> None:  # fmt: skip
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
        shutil.copyfile(shipped / "acl", etc / "acl")
        device_args = [f"{d}={pw}" for d, pw in devices.items()]
        for passwd, users in (("passwd", device_args), ("passwd-server", [f"peep-server={server_password}"])):
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
        stderr = self.workdir / "stderr.txt"
        for attempt in range(3):
            err_at = stderr.stat().st_size if stderr.exists() else 0
            log_at = len(self.log())
            with open(stderr, "ab") as err:
                self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=err)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    said = stderr.read_text()[err_at:] + self.log()[log_at:]  # the bind error: log or stderr
                    if "Address already in use" in said and not self._started and attempt < 2:
                        self._listen_on(free_port(), free_port())
                        break
                    raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: {said[-2000:]}")
                if port_open(self.dev_port) and port_open(self.srv_port):
                    self._started = True
                    return self
                time.sleep(0.05)
            else:
                stop_process(self.proc, signal.SIGKILL)
                raise RuntimeError(f"mosquitto did not listen on {self.dev_port} and {self.srv_port} in {timeout} s")
        raise RuntimeError("mosquitto did not start: its ports were taken three times")

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


# --------------------------------------------------------------------------- a cuttable network path


class _Connection:
    """One proxied connection: its two sockets, its two pumps, how many pumps have ended."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.pumps: list[threading.Thread] = []
        self.ended = 0
        self.dropped = False  # by cut() or close(): end with a reset, never a half-close


_LINGER_0 = struct.pack("ii", 1, 0)  # struct linger {on, 0 s}: close() sends RST


def _abort(s: socket.socket) -> None:
    """Close ``s`` with a reset, so its peer's next read or write fails instead of seeing a clean end."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
    s.close()


class TcpProxy:
    """A TCP proxy on 127.0.0.1 to ``target``: two threads per connection pump the bytes both ways.

    :meth:`cut` resets every open connection (each side sees its connection fail,
    as after a network fault, rather than end cleanly) and stops listening, so a
    new connect is refused, until :meth:`heal` listens again on the same port. A
    connection's threads end with it; :meth:`close` ends them all.

    Parameters
    ----------
    listen_port : int
        The port to listen on (0: a free one; :attr:`port` says which).
    target : (host, port)
        Where each connection goes.
    max_connections : int
        Connections open at once; more are reset as they arrive (counted in ``refused``).
    connect_timeout : float
        Seconds to connect to ``target``; a connection that cannot is reset.

    Examples
    --------
    >>> with TcpProxy(0, ("127.0.0.1", broker.dev_port)) as path:  # doctest: +SKIP
    ...     camera.connect("localhost", path.port); path.cut(); path.heal()
    """

    def __init__(self, listen_port: int, target: tuple[str, int], *, max_connections: int = 256,
                 connect_timeout: float = 5.0) -> None:  # fmt: skip
        if max_connections < 1:
            raise ValueError(f"max_connections: expected at least 1, received {max_connections}")
        self.target = target
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._conns: set[_Connection] = set()
        self._closed = False
        self.is_cut = False
        self.accepted = self.refused = self.cuts = 0
        self.bytes_in = self.bytes_out = 0  # towards the target, back from it
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self.port = listen_port
        self._listen()

    # ------------------------------------------------------------ listening

    def _listen(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # heal binds the port again past TIME_WAIT
        try:
            s.bind(("127.0.0.1", self.port))
        except OSError as exc:
            s.close()
            raise RuntimeError(f"proxy to {self.target}: cannot listen on 127.0.0.1:{self.port} ({exc})") from exc
        s.listen(64)
        s.settimeout(0.2)  # the acceptor looks at least this often whether it should stop
        self.port = int(s.getsockname()[1])
        self._listener = s
        self._acceptor = threading.Thread(target=self._accept, args=(s,), name=f"proxy-{self.port}", daemon=True)
        self._acceptor.start()

    def _unlisten(self) -> None:
        s, t = self._listener, self._acceptor
        self._listener = self._acceptor = None
        if s is not None:
            s.close()
        if t is not None:
            t.join(5)

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by cut() or close()
            self._open(client)

    def _open(self, client: socket.socket) -> None:
        with self._lock:
            full = len(self._conns) >= self.max_connections
        upstream = None
        if not full:
            try:
                upstream = socket.create_connection(self.target, timeout=self.connect_timeout)
            except OSError:
                upstream = None
        with self._lock:
            if upstream is None or self.is_cut or self._closed:  # full, target down, or cut meanwhile
                self.refused += 1
                _abort(client)
                if upstream is not None:
                    _abort(upstream)
                return
            client.settimeout(None)
            upstream.settimeout(None)
            conn = _Connection(client, upstream)
            name = f"proxy-{self.port}-{self.accepted}"
            conn.pumps = [
                threading.Thread(target=self._pump, args=(conn, client, upstream, "bytes_in"), name=f"{name}-in",
                                 daemon=True),
                threading.Thread(target=self._pump, args=(conn, upstream, client, "bytes_out"), name=f"{name}-out",
                                 daemon=True),
            ]  # fmt: skip
            self._conns.add(conn)
            self.accepted += 1
            for t in conn.pumps:  # started under the lock: cut() may join them as soon as they are listed
                t.start()

    def _pump(self, conn: _Connection, src: socket.socket, dst: socket.socket, counter: str) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                with self._lock:
                    setattr(self, counter, getattr(self, counter) + len(data))
            if not conn.dropped:
                # The sender finished: pass its half-close on; the other direction may still have bytes to carry.
                dst.shutdown(socket.SHUT_WR)
        except OSError:
            # One side failed: the connection is over both ways (wake the other pump, in recv or sendall).
            conn.dropped = True
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        finally:
            with self._lock:
                conn.ended += 1
                last = conn.ended == len(conn.pumps)
                if last:
                    self._conns.discard(conn)
            if last:
                for s in (conn.client, conn.upstream):
                    if conn.dropped:
                        _abort(s)
                    else:
                        s.close()

    # ------------------------------------------------------------ faults

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def cut(self, timeout: float = 5.0) -> None:
        """Reset every open connection and refuse new ones until :meth:`heal`; waits (``timeout`` s at most)
        for their threads to end."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the proxy on port {self.port} is closed")
            self.is_cut = True
            self.cuts += 1
        self._unlisten()
        self._drop_all(timeout)

    def heal(self) -> None:
        """Listen again on the same port (nothing happens when it is not cut)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the proxy on port {self.port} is closed")
            if not self.is_cut:
                return
        self._listen()  # still cut if the port was taken meanwhile (it raises)
        with self._lock:
            self.is_cut = False

    def _drop_all(self, timeout: float) -> None:
        with self._lock:
            conns = list(self._conns)
        # SHUT_RD wakes a pump from recv without sending a FIN, so the peers see only the reset the last pump's
        # close sends; a pump blocked in sendall (its reader stalled) needs SHUT_RDWR, FIN first.
        deadline = time.monotonic() + timeout
        for how, wait in ((socket.SHUT_RD, min(0.5, timeout)), (socket.SHUT_RDWR, timeout)):
            for conn in conns:
                conn.dropped = True
                if any(t.is_alive() for t in conn.pumps):
                    for s in (conn.client, conn.upstream):
                        with contextlib.suppress(OSError):
                            s.shutdown(how)
            until = min(deadline, time.monotonic() + wait)
            for conn in conns:
                for t in conn.pumps:
                    t.join(max(0.0, until - time.monotonic()))

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening and reset every connection; the proxy cannot be used again."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._unlisten()
        self._drop_all(timeout)

    def stats(self) -> dict[str, int | bool]:
        """Connections accepted, refused and open, cuts so far, bytes each way, and whether it is cut now."""
        with self._lock:
            return {
                "accepted": self.accepted,
                "refused": self.refused,
                "open": len(self._conns),
                "cuts": self.cuts,
                "cut": self.is_cut,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
            }

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- process readings


class ProcessStats:
    """Readings of a process from Linux ``/proc`` (no dependency): memory, open files, threads, CPU time."""

    _TICK = os.sysconf("SC_CLK_TCK")

    @classmethod
    def sample(cls, pid: int) -> dict[str, float] | None:
        """``{rss_mb, fds, threads, cpu_s}`` of process ``pid``, or None when it is gone or a zombie.

        ``rss_mb``: resident memory in MiB; ``fds``: open file descriptors;
        ``threads``: its threads; ``cpu_s``: user + system CPU seconds since it
        started (its own, not its children's). A process that ends between the
        reads also gives None. Reading another user's descriptors needs that
        user or root (PermissionError otherwise).
        """
        base = Path(f"/proc/{pid}")
        try:
            status = (base / "status").read_text()
            fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
            fds = len(os.listdir(base / "fd"))
        except (FileNotFoundError, ProcessLookupError):
            return None
        # fields[0] is the state (the third field of stat); a zombie has no memory, files or threads left.
        if fields[0] in ("Z", "X"):
            return None
        values: dict[str, int] = {}
        for line in status.splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "Threads"):
                values[key] = int(rest.split()[0])
        if "VmRSS" not in values:  # a kernel thread, or the process ended while being read
            return None
        return {
            "rss_mb": round(values["VmRSS"] / 1024, 3),
            "fds": fds,
            "threads": values.get("Threads", 0),
            "cpu_s": (int(fields[11]) + int(fields[12])) / cls._TICK,
        }
