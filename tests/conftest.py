"""Shared fixtures: the staged LFW data, a signing key pair, bundles.

The LFW copy is required: .ci/run and scripts/test.sh stage it into a
writable data home and export SCIKIT_LEARN_DATA. Without it the tests that
need faces fail with a message saying how to stage it (never a silent skip).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


def _data_home() -> str:
    home = os.environ.get("SCIKIT_LEARN_DATA")
    if not home or not (Path(home) / "lfw_home" / "lfw_funneled").is_dir():
        pytest.fail(
            'LFW data not staged: run the suite with scripts/test.sh (or eval "$(bash scripts/stage-lfw.sh)") '
            f"so SCIKIT_LEARN_DATA holds lfw_home/ (got {home!r})"
        )
    return home


def _peep_logger_state() -> tuple:
    import logging

    log = logging.getLogger("peep")
    return list(log.handlers), log.level, log.propagate


#: The ``peep`` logger as the test process started: no handler of its own, records propagated to the root.
_PEEP_LOGGER_AT_START = _peep_logger_state()


@pytest.fixture(autouse=True)
def _peep_logging_restored():
    """The ``peep`` logger as the process started, before and after each test. A CLI run in-process
    (``main([...])``, in a test or in a module's fixture such as the demo's) configures it the way a process
    would: its own handler, ``propagate = False``. Left so, every later test on that worker that reads peep's
    records through ``caplog`` sees none (a door test failed that way after a CLI test, and after the demo)."""
    import logging

    def restore() -> None:
        log = logging.getLogger("peep")
        handlers, level, propagate = _PEEP_LOGGER_AT_START
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate

    restore()
    yield
    restore()


@pytest.fixture(scope="session")
def data_home() -> str:
    return _data_home()


@pytest.fixture
def lfw_folder(data_home: str, tmp_path: Path):
    """``lfw_folder({"Al_Gore": 8, ...}, name="faces")``: a folder-per-person dataset in ``tmp_path``.

    Each person's first n LFW photos, as symlinks (nothing copied).
    """

    def make(people: dict[str, int], name: str = "faces") -> Path:
        src = Path(data_home) / "lfw_home" / "lfw_funneled"
        folder = tmp_path / name
        for person, n in people.items():
            (folder / person).mkdir(parents=True)
            for f in sorted((src / person).glob("*.jpg"))[:n]:
                (folder / person / f.name).symlink_to(f)
        return folder

    return make


@pytest.fixture(scope="session")
def lfw100(data_home: str):
    """The paper's set: 5 people with >= 100 images, detector-normalised 47x62."""
    from peep.server.datasets import load_dataset

    return load_dataset("lfw", data_home=data_home, min_faces=100)


@pytest.fixture(scope="session")
def lfw_background(data_home: str):
    """LFW's 5-9 image people: a background population disjoint from lfw100."""
    from peep.server.datasets import load_dataset

    return load_dataset("lfw", data_home=data_home, min_faces=5, max_faces=9)


@pytest.fixture(scope="session")
def keypair(tmp_path_factory: pytest.TempPathFactory):
    from peep.core.bundle import load_private_key, load_public_key, write_keypair

    d = tmp_path_factory.mktemp("keys")
    key_path, pub_path = write_keypair(d / "site")
    return load_private_key(key_path), load_public_key(pub_path), key_path, pub_path


@pytest.fixture(scope="session")
def decision_keys(tmp_path_factory: pytest.TempPathFactory):
    """The server's decision key (signs what doors deciding over MQTT act on): (private, public, key path, pub path)."""
    from peep.core.bundle import load_private_key, load_public_key, write_keypair

    key_path, pub_path = write_keypair(tmp_path_factory.mktemp("keys") / "decisions")
    return load_private_key(key_path), load_public_key(pub_path), key_path, pub_path


@pytest.fixture(scope="session")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory, lfw_background, keypair) -> Path:
    """A signed nc=128 bundle built from the background population."""
    from peep.server.bundles.build import build_bundle

    out = tmp_path_factory.mktemp("bundle")
    build_bundle(lfw_background, n_components=128, signing_key=keypair[0], out_dir=out)
    return out


@pytest.fixture(scope="session")
def bundle(bundle_dir: Path, keypair):
    from peep.core.bundle import ProjectionBundle

    return ProjectionBundle.load(bundle_dir, keypair[1])


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


# The suite runs on several pytest-xdist workers (scripts/test.sh: `--dist loadgroup`). A fixture of module or
# class scope is built once per worker that runs one of its tests: spread over workers, a module's demo run, soak
# or trained server would be paid once per worker. Every test that uses such a fixture is therefore grouped with
# its module (or class) so that one worker runs them all and pays for it once; the module's other tests stay free
# to run anywhere. A test that names an `xdist_group` itself keeps its own.
_SHARED_SCOPES = ("module", "class", "package")


#: Modules by how long they hold a worker, longest first: xdist hands out the work in collection order, and the
#: soak (about six minutes on one worker) started last would end the run minutes after everything else.
_FIRST_MARKERS = ("soak", "demo", "bench", "slow", "processes")


#: Session fixtures too costly to build on every worker (a session fixture is built once per worker that uses it:
#: the tiny audit took 70-80 s on each of three workers at once): their tests share one worker.
_GROUP_BY_SESSION_FIXTURE = {
    "tiny_audit": "session:audit",
    "small_ctx": "session:audit",
    "audit_data": "session:audit",
}


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker with --dist loadgroup, every grouped test must carry its group in its node id (which
    is how xdist keeps a group on one worker): pytest 9.2 made that suffix a silent no-op, and every module's
    fixtures were then built on every worker at once (four door benches pinned to one core)."""
    config = session.config
    if not os.environ.get("PYTEST_XDIST_WORKER") or not config.getvalue("loadgroup"):
        return
    lost = [it.nodeid for it in session.items if it.get_closest_marker("xdist_group") and "@" not in it.nodeid]
    if lost:
        pytest.exit(
            f"pytest-xdist's loadgroup did not apply the xdist_group of {len(lost)} tests (e.g. {lost[0]}) with "
            f"pytest {pytest.__version__}: keep pytest < 9.2 (pyproject.toml) or run with -n 0",
            returncode=3,
        )


def _module_rank(items: list[pytest.Item]) -> dict[str, int]:
    rank: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        here = next(
            (i for i, m in enumerate(_FIRST_MARKERS) if item.get_closest_marker(m) is not None), len(_FIRST_MARKERS)
        )
        rank[module] = min(rank.get(module, here), here)
    return rank


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Whole modules move (a stable sort on the module's rank), so a module's fixtures are still built once.
    rank = _module_rank(items)
    items.sort(key=lambda it: rank[it.nodeid.split("::")[0]])
    for item in items:
        _mark_needs(item)
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        scopes = {defs[-1].scope for name in info.names_closure if (defs := info.name2fixturedefs.get(name))}
        shared = next((g for name, g in _GROUP_BY_SESSION_FIXTURE.items() if name in info.names_closure), None)
        if shared is not None:
            item.add_marker(pytest.mark.xdist_group(shared))
        elif scopes & set(_SHARED_SCOPES):
            owner = item.nodeid.split("::")[0]
            if "class" in scopes and item.cls is not None:
                owner = f"{owner}::{item.cls.__name__}"
            item.add_marker(pytest.mark.xdist_group(owner))


# What a test needs, read from the fixtures it uses: a marker says so, so that `-m "not postgres"` selects
# without anyone keeping lists (the modules that need more than a fixture shows mark themselves).
_NEEDS_BY_FIXTURE = {
    "pg_admin": "postgres",
    "pg_dsn": "postgres",
    "system_broker": "mqtt",
}


def _mark_needs(item: pytest.Item) -> None:
    names = set(getattr(item, "fixturenames", ()))
    for fixture, marker in _NEEDS_BY_FIXTURE.items():
        if fixture in names and item.get_closest_marker(marker) is None:
            item.add_marker(getattr(pytest.mark, marker))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The whole run's wall time, install included, when scripts/test.sh or .ci/run started it."""
    import time

    started = os.environ.get("PEEP_TEST_STARTED_S")
    if started and started.isdigit():
        workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT") or getattr(
            terminalreporter.config.option, "numprocesses", None
        )
        terminalreporter.write_line(
            f"suite: {time.time() - int(started):.0f} s wall from the start of the script (install included), "
            f"{workers or 1} worker(s)"
        )


# A test that fails before stopping a thread it started can leave a non-daemon thread that keeps the
# interpreter from exiting after the summary is printed: the run then hangs until CI's time limit, and the
# one failing test is reported as a timeout of everything. A watchdog outlives the session: if the process
# has not exited a while after it (the interpreter's own exit handlers stop executors' threads first), it
# names the threads still running, with their stacks, and ends the process with a failing status.
_EXIT_GRACE_S = 60.0
_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


def _exit_watchdog(grace_s: float) -> None:
    import sys
    import threading
    import time
    import traceback

    time.sleep(grace_s)
    left = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    frames = sys._current_frames()
    print(f"\nconftest: the run has not ended {grace_s:.0f} s after its summary; threads still running:",
          file=sys.stderr)  # fmt: skip
    for t in left:
        print(f"--- {t.name}", file=sys.stderr)
        traceback.print_stack(frames.get(t.ident), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    status = _exit_status[-1] if _exit_status else 1
    os._exit(status or 1)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    import threading

    grace = float(os.environ.get("PEEP_TEST_EXIT_GRACE_S", _EXIT_GRACE_S))
    threading.Thread(target=_exit_watchdog, args=(grace,), name="exit-watchdog", daemon=True).start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With ``$PEEP_TEST_TIMELINE`` set to a folder: one JSON line per test in ``<folder>/<worker>.jsonl``
    (start and end on the wall clock, CPU seconds of the worker and of the children it has reaped), to see
    where a parallel run's time and CPU go (docs/DEVELOPING.md)."""
    folder = os.environ.get("PEEP_TEST_TIMELINE")
    if not folder:
        return (yield)
    import json
    import resource
    import time

    def cpu() -> tuple[float, float]:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime

    t0, (s0, c0) = time.time(), cpu()
    try:
        return (yield)
    finally:
        t1, (s1, c1) = time.time(), cpu()
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(Path(folder) / f"{worker}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"test": item.nodeid, "worker": worker, "start": t0, "end": t1,
                                 "cpu": round(s1 - s0, 3), "cpu_children": round(c1 - c0, 3)}) + "\n")  # fmt: skip
