"""The soak's faults on a camera's own machine: a full state disk and a stepped wall clock.

:class:`LimitedFolder`
    A camera's state folder made a small tmpfs of its own before the camera starts:
    :meth:`~LimitedFolder.fill` writes a filler file until the filesystem refuses
    more (ENOSPC), :meth:`~LimitedFolder.free` deletes it, :meth:`~LimitedFolder.close`
    unmounts. The ``disk_full`` fault.
:class:`SteppedClock`
    A camera process's wall clock offset through libfaketime (``LD_PRELOAD``) and a
    timestamp file the soak rewrites: :meth:`~SteppedClock.step` moves the wall clock,
    :meth:`~SteppedClock.reset` puts it back; the monotonic clock never moves. The
    ``clock_step`` fault.

Both raise :class:`~peep.lab.processes.control.PartUnavailable` naming what is missing
(root or ``mount``; libfaketime or a C compiler), so the soak can leave that fault kind out
with the reason.

Why tmpfs: on a full tmpfs every write fails at once and free space returns the moment the
filler is deleted; SQLite answers both the same way it does on a full ext4 image ("database or
disk is full", the transaction rolled back, the connection usable again once space returns), but
ext4 keeps reserved and delayed-allocation blocks that let a few more commits through after the
filler stopped, which makes "full" fuzzy.

Why a shim next to libfaketime: Debian's libfaketime 0.9.10, asked to leave the monotonic clock
alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``), still rewrites the deadline of
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` and hands the kernel a time in the past:
``EINVAL``, which is every ``time.sleep`` from Python 3.11 on. A twelve-line library preloaded
before it sends monotonic sleeps straight to the kernel (the monotonic clock is not faked, so
that is exact); it is compiled once with the system's C compiler, and only when a probe shows
the installed libfaketime needs it.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Self

from peep.lab.processes.control import PartUnavailable

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- a full disk

#: Bytes written per filler chunk: small enough that the last one leaves the filesystem full to the block.
_CHUNK = 64 * 1024


def _mounted_at(folder: Path) -> bool:
    """Whether something is mounted exactly at ``folder`` (``/proc/self/mountinfo``'s fifth field)."""
    target = str(folder.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    # Mount points with spaces are written with octal escapes (\040).
    return any(line.split()[4].encode().decode("unicode_escape") == target for line in lines if len(line.split()) > 4)


class LimitedFolder:
    """A folder that is a tmpfs of ``size_mb`` MiB of its own: the state folder of one camera.

    Mount it (:meth:`mount`) before the camera starts: whatever the folder held is
    hidden by the mount, so the camera starts with an empty state (the soak creates
    its cameras fresh). :meth:`fill` leaves the camera's files as they are and takes
    the rest of the space; :meth:`free` gives it back.

    Parameters
    ----------
    folder : Path
        The camera's ``device.state_dir`` (created if missing).
    size_mb : int
        The filesystem's size in MiB (the camera's spool and ledger must fit with room to spare:
        a release is refused below :data:`peep.edge.spool.MIN_FREE_BYTES` free).
    timeout_s : float
        Bound on each ``mount``/``umount`` call.

    Raises
    ------
    PartUnavailable
        Not root, ``mount``/``umount`` missing, or the kernel refuses a tmpfs here (the message says which).

    Examples
    --------
    >>> disk = LimitedFolder(state_dir, size_mb=16).mount()   # doctest: +SKIP
    >>> camera.start(); disk.fill(); ...; disk.free()         # doctest: +SKIP
    >>> disk.close()                                          # doctest: +SKIP
    """

    def __init__(self, folder: Path, *, size_mb: int = 16, timeout_s: float = 20.0) -> None:
        if not 1 <= size_mb <= 4096:
            raise ValueError(f"size_mb: expected 1 to 4096 MiB, received {size_mb}")
        if os.geteuid() != 0:
            raise PartUnavailable("a size-limited state folder needs root (mount -t tmpfs); this process is not")
        self.mount_bin, self.umount_bin = shutil.which("mount"), shutil.which("umount")
        if self.mount_bin is None or self.umount_bin is None:
            raise PartUnavailable("a size-limited state folder needs mount and umount (util-linux); not on PATH")
        self.folder = Path(folder)
        self.size_mb = int(size_mb)
        self.timeout_s = float(timeout_s)
        self.filler = self.folder / ".soak-filler"
        self.mounted = False
        self.filled_bytes = 0

    def mount(self) -> Self:
        """Mount the tmpfs at the folder (nothing happens when this object already did)."""
        if self.mounted:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        if _mounted_at(self.folder):
            raise RuntimeError(f"{self.folder}: something is already mounted there; refusing to mount over it")
        argv = [str(self.mount_bin), "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0700", "tmpfs", str(self.folder)]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise PartUnavailable(
                f"mount -t tmpfs at {self.folder} did not answer within {self.timeout_s:g} s"
            ) from None
        if r.returncode != 0:
            # A container without CAP_SYS_ADMIN says "permission denied" even to root.
            raise PartUnavailable(f"mount -t tmpfs at {self.folder} refused ({r.returncode}): {r.stderr.strip()}")
        self.mounted = True
        return self

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer may still use on the folder's filesystem (``f_bavail``)."""
        st = os.statvfs(self.folder)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Write the filler until the filesystem refuses (ENOSPC); returns the bytes it took.

        The camera's own files are not touched: its spool and ledger keep what they hold, and every
        write they try from now on fails until :meth:`free`. Filling a folder that is filled already
        takes whatever space the camera freed meanwhile.

        Raises
        ------
        RuntimeError
            The folder is not mounted by this object (filling the disk under it would fill the machine's).
        OSError
            A write failed for another reason than a full disk.
        """
        if not self.mounted:
            raise RuntimeError(f"{self.folder}: not mounted; fill() only fills its own tmpfs")
        chunk = b"\0" * _CHUNK
        written = 0
        # Unbuffered: each write reaches the filesystem here, and its ENOSPC here (not at close).
        with open(self.filler, "ab", buffering=0) as f:
            size = _CHUNK
            while size >= 512:  # the last chunks smaller: the filesystem full to its last block
                try:
                    written += f.write(chunk[:size]) or 0  # a short write near the end: the next one says ENOSPC
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    size //= 2
        self.filled_bytes += written
        log.info("soak: %s filled (%d bytes of filler, %d bytes left)", self.folder, self.filled_bytes,
                 self.free_bytes())  # fmt: skip
        return written

    def free(self) -> None:
        """Delete the filler: the space returns at once (nothing happens when there is none)."""
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()
        self.filled_bytes = 0

    def close(self) -> None:
        """Unmount (lazily when the camera still holds files there: it detaches now, ends when they close).

        Whatever the camera kept there goes with the tmpfs: read its ledger and spool before.
        """
        if not self.mounted:
            return
        self.free()
        for argv in ([str(self.umount_bin), str(self.folder)], [str(self.umount_bin), "-l", str(self.folder)]):
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                continue
            if r.returncode == 0:
                self.mounted = False
                return
        log.warning("soak: could not unmount %s (tried umount and umount -l)", self.folder)

    def __enter__(self) -> Self:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- a stepped wall clock

#: Where Debian installs libfaketime (one folder per architecture).
LIBFAKETIME_GLOBS = ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                     "/usr/local/lib/faketime/libfaketime.so.1")  # fmt: skip

_SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
/* Monotonic sleeps go to the kernel: libfaketime 0.9.10 mangles their absolute deadlines (EINVAL). */
int clock_nanosleep(clockid_t clk, int flags, const struct timespec *req, struct timespec *rem) {
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (clk == CLOCK_MONOTONIC || clk == CLOCK_MONOTONIC_RAW || clk == CLOCK_BOOTTIME)
        return syscall(SYS_clock_nanosleep, clk, flags, req, rem) == 0 ? 0 : errno;
    if (!next) next = dlsym(RTLD_NEXT, "clock_nanosleep");
    return next(clk, flags, req, rem);
}
"""

# A Python 3.11+ time.sleep is clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME): the call libfaketime breaks.
_PROBE = "import time; time.sleep(0.01); print(repr(time.time()), repr(time.monotonic()))"


def find_libfaketime() -> Path:
    """The installed ``libfaketime.so.1``.

    Raises
    ------
    PartUnavailable
        Not installed (the message says how to install it).
    """
    override = os.environ.get("PEEP_LIBFAKETIME")
    candidates = [override] if override else [p for g in LIBFAKETIME_GLOBS for p in sorted(glob.glob(g))]
    for c in candidates:
        if c and os.path.isfile(c):
            return Path(c)
    raise PartUnavailable(
        "libfaketime not found ("
        + (f"PEEP_LIBFAKETIME={override}" if override else ", ".join(LIBFAKETIME_GLOBS))
        + "); Debian: apt-get install libfaketime (scripts/bootstrap.sh installs it as root)"
    )


def _probe(env: dict[str, str], timeout_s: float) -> tuple[bool, str]:
    """Run :data:`_PROBE` under ``env``: (whether it worked, its output or error)."""
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, **env}, capture_output=True,
                           text=True, timeout=timeout_s)  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout_s:g} s"
    return r.returncode == 0, (r.stdout if r.returncode == 0 else r.stderr).strip()[-300:]


def _build_shim(workdir: Path, timeout_s: float) -> Path:
    """Compile the monotonic-sleep shim into ``workdir`` (once per source text; reused after)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise PartUnavailable(
            "libfaketime here breaks Python's time.sleep when the monotonic clock is left alone (EINVAL), and no "
            "C compiler (cc, gcc, clang) is on PATH to build the shim that fixes it"
        )
    tag = hashlib.sha256(_SHIM_C.encode()).hexdigest()[:12]
    out = workdir / f"peep-monotonic-sleep-{tag}.so"
    if out.exists():
        return out
    workdir.mkdir(parents=True, exist_ok=True)
    # This process's own source and temporary files: two runs building at once (the test suite's workers) would
    # otherwise compile from, and replace, each other's half-written files.
    src = workdir / f"peep-monotonic-sleep-{tag}.{os.getpid()}.c"
    src.write_text(_SHIM_C)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src), "-ldl"], capture_output=True,
                       text=True, timeout=timeout_s)  # fmt: skip
    if r.returncode != 0:
        raise PartUnavailable(f"could not build the monotonic-sleep shim with {cc}: {r.stderr.strip()[-300:]}")
    os.replace(tmp, out)  # another run building the same shim sees it whole or not at all
    src.unlink(missing_ok=True)
    return out


class SteppedClock:
    """One camera's wall clock, offset by libfaketime from a file the soak rewrites.

    :meth:`env` is what the camera process needs in its environment (set before it
    starts); :meth:`step` and :meth:`reset` change what its wall clock says while it
    runs (libfaketime reads the file at every call: ``FAKETIME_NO_CACHE``). Its
    monotonic clock, and every sleep and timeout on it, are left alone, as an NTP step
    leaves them.

    Parameters
    ----------
    workdir : Path
        Where the timestamp file (and, when needed, the shim) are kept.
    name : str
        Names the timestamp file (a camera id): one clock per camera.
    timeout_s : float
        Bound on the probes and the shim's compilation.

    Raises
    ------
    PartUnavailable
        libfaketime not installed, or it breaks sleeps here and there is no compiler for the shim, or it
        does not move the clock of a child process at all (the message says which).

    Examples
    --------
    >>> clock = SteppedClock(out / "clocks", name="cam-1")       # doctest: +SKIP
    >>> Camera(..., env={**env, **clock.env()}).start()           # doctest: +SKIP
    >>> clock.step(600); ...; clock.reset()                      # doctest: +SKIP
    """

    def __init__(self, workdir: Path, *, name: str = "clock", timeout_s: float = 60.0) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.library = find_libfaketime()
        self.file = self.workdir / f"faketime-{name}"
        self.offset_s = 0.0
        self._write(0.0)
        self.preload = [str(self.library)]
        ok, said = _probe(self.env(), timeout_s)
        if not ok and "Invalid argument" in said:
            self.preload = [str(_build_shim(self.workdir, timeout_s)), str(self.library)]
            ok, said = _probe(self.env(), timeout_s)
        if not ok:
            raise PartUnavailable(f"a process under {self.library} fails: {said}")
        self._check_moves(timeout_s)

    def _check_moves(self, timeout_s: float) -> None:
        """A step must move a child's wall clock and not its monotonic clock; else the fault would be a no-op."""
        self._write(3600.0)
        try:
            import time

            before = time.time()
            ok, said = _probe(self.env(), timeout_s)
            if not ok:
                raise PartUnavailable(f"a process under {self.library} fails after a step: {said}")
            wall = float(said.split()[0])
        finally:
            self._write(0.0)
        if not 3000.0 < wall - before < 4200.0:
            raise PartUnavailable(
                f"{self.library} did not step a child's wall clock by an hour (it said {wall - before:+.0f} s): "
                "LD_PRELOAD ignored (a setuid or static interpreter?)"
            )

    def _write(self, offset_s: float) -> None:
        # Written whole and renamed: a reader never sees a half-written offset (it would read it as +0).
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+.0f}\n")
        os.replace(tmp, self.file)
        self.offset_s = offset_s

    def env(self) -> dict[str, str]:
        """The camera process's extra environment: the preload, the timestamp file, no cache, monotonic left alone."""
        return {
            "LD_PRELOAD": " ".join(self.preload),
            "FAKETIME_TIMESTAMP_FILE": str(self.file),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            # Without this libfaketime would also fake file timestamps (stat), which nothing here wants.
            "NO_FAKE_STAT": "1",
        }

    def step(self, seconds: float) -> None:
        """Set the camera's wall clock ``seconds`` from the real one (not cumulative: step(600) twice is +600)."""
        if not abs(seconds) <= 10 * 365 * 86400:
            raise ValueError(f"seconds: expected a step within ten years, received {seconds}")
        self._write(float(seconds))

    def reset(self) -> None:
        """The camera's wall clock back to the real one."""
        self._write(0.0)

    def close(self) -> None:
        """Reset (the file stays: a camera still running under it reads it at every call)."""
        self.reset()
