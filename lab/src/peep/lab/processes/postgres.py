"""A PostgreSQL cluster of a run's own: ``initdb`` in a temporary folder, trust authentication on 127.0.0.1, a
free port; started, stopped ``fast`` or ``immediate`` (a crash: recovery from the WAL on the next start), its
tables' sizes read (:class:`PostgresCluster`).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from peep.lab.processes.control import PartUnavailable, running
from peep.lab.processes.ports import free_port

log = logging.getLogger(__name__)

#: The stop modes of ``pg_ctl stop -m``.
PG_STOP_MODES = ("smart", "fast", "immediate")
# The socket path (folder + "/.s.PGSQL.<port>") must fit sun_path's 108 bytes.
_MAX_SOCKET_DIR = 90


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
        if r.returncode != 0 and self.pid is not None and running(self.pid):
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
