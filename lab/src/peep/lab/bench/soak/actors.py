"""The soak's other users: a reader of the decisions, an enrolment desk, a console operator and a trainer.

Each is a thread of its own, bounded in count and time, that stops by itself at :meth:`stop`, and keeps a
history the checker reads at the end:

:class:`DecisionLog`
    Reads the server's decisions (``recognition_events``) every few seconds and keeps every row it saw. The
    soak's retention deletes decisions a few minutes after they are made, so the end of the run can no longer
    read them all from the database: this log is the committed history (each row read well within its
    retention, faults included, since a stopped database keeps its rows until it is back).
:class:`EnrolmentDesk`
    Now and then, the real ``peep-edge enroll`` of an enrolment desk (a device allowed to enrol, nothing more)
    releasing a new person's photos; checked against the templates the server stored for that person.
:class:`ConsoleOperator`
    Logs in to a replica's console (an account made with ``peep console add-user``, its one-time password
    changed at first login as an operator would) and loads Live and Devices every few seconds; each load's
    status and time go to the timeline, and the last Devices page gives the ε the console shows per device.
:class:`MidRunTraining`
    A training run through the balancer, its model promoted, while the cameras keep deciding.
"""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from peep.lab.bench.soak.timeline import Timeline

PEEP = str(Path(sys.executable).parent / "peep")
PEEP_EDGE = str(Path(sys.executable).parent / "peep-edge")
NICE = shutil.which("nice") or "nice"


class _Loop:
    """A daemon thread calling ``step()`` every ``interval_s`` until stopped (each step's failure kept, not
    raised: an actor's error is a finding of the run, never the end of it)."""

    def __init__(self, name: str, interval_s: float) -> None:
        self.interval_s = interval_s
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> bool:
        self._stop.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def step(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:
                if len(self.errors) < 200:
                    self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            self._stop.wait(self.interval_s)


class DecisionLog(_Loop):
    """Every decision row read from ``recognition_events`` over the run: ``rows[id] = (event_id, device,
    message, model version)``.

    Each read takes the newest ``overlap`` ids again: ids come from a sequence, and two replicas' transactions
    may commit out of id order, so a row with a lower id can appear after a higher one was read.
    """

    def __init__(self, dsn: str, *, interval_s: float = 2.0, overlap: int = 5000) -> None:
        super().__init__("soak-decisions", interval_s)
        self.dsn, self.overlap = dsn, overlap
        self.rows: dict[int, tuple[str, str, str, str]] = {}
        #: Verify decisions (a door's): id -> (device, message id, claimed subject, accepted, time).
        self.verifies: dict[int, tuple[str, str, str, bool, float]] = {}
        self._high = 0
        self._lock = threading.Lock()

    def step(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, connect_timeout=3) as c:
            got = c.execute(
                "SELECT id, event_id, device_id, message_id, model_version, purpose, claimed_subject, accepted, at "
                "FROM recognition_events WHERE id > %s ORDER BY id",
                (max(0, self._high - self.overlap),),
            ).fetchall()
        with self._lock:
            for i, e, d, m, v, purpose, claimed, accepted, at in got:
                self.rows[int(i)] = (str(e), str(d), str(m), str(v))
                if purpose == "verify":
                    self.verifies[int(i)] = (str(d), str(m), str(claimed), bool(accepted), float(at))
                self._high = max(self._high, int(i))

    def read_now(self) -> None:
        """One read at once (the end of the run), its error raised."""
        self.step()

    def decided(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(d, m) for _e, d, m, _v in self.rows.values()]

    def verify_decisions(self, device: str) -> list[tuple[str, str, bool, float]]:
        """``device``'s Verify decisions as (message id, claimed subject, accepted, time)."""
        with self._lock:
            return [(m, c, a, t) for d, m, c, a, t in self.verifies.values() if d == device]

    def by_model(self) -> dict[str, int]:
        """Decisions per model version (the mid-run training's model taking over shows here)."""
        with self._lock:
            out: dict[str, int] = {}
            for *_r, v in self.rows.values():
                out[v] = out.get(v, 0) + 1
            return out

    def committed(self) -> list[tuple[int, str]]:
        with self._lock:
            return [(i, r[0]) for i, r in sorted(self.rows.items())]


@dataclass
class Enrolment:
    """One enrolment at the desk: who, how many templates asked, the command's exit code and last words."""

    subject: str
    count: int
    at_s: float
    rc: int | None = None
    said: str = ""
    stored: int | None = None


class EnrolmentDesk(_Loop):
    """``peep-edge enroll`` of the next person every ``interval_s`` (at most ``len(people)`` enrolments).

    Parameters
    ----------
    config : Path
        The desk's edge configuration (a device with ``enrolment_desk = true`` on the server).
    env : dict
        Its environment (the token variable).
    people : sequence of (subject, image folder)
    count : int
        Templates each enrolment releases.
    clock : callable
        Seconds into the run (the enrolment's ``at_s``).
    niceness : int
        How much lower than the soak's own the desk's CPU priority is (``nice``). A desk is a machine of its
        own at a reception; on a rig where it shares the cores with the cameras, each enrolment's burst (the
        projector loaded, a dozen photos searched for faces) delays the cameras' releases by up to 250 ms.
        Run lower, it stands for the other machine rather than for load on the cameras. 0 runs it as is.
    """

    def __init__(self, config: Path, env: dict[str, str], people: Sequence[tuple[str, Path]], *, count: int,
                 interval_s: float, clock: Callable[[], float], log: Path, niceness: int = 10) -> None:  # fmt: skip
        super().__init__("soak-desk", interval_s)
        if not 0 <= niceness <= 19:
            raise ValueError(f"niceness: expected 0..19, got {niceness!r}")
        self.config, self.env, self.people, self.count = config, env, list(people), count
        self.clock, self.log, self.niceness = clock, log, niceness
        self.enrolments: list[Enrolment] = []

    def step(self) -> None:
        if len(self.enrolments) >= len(self.people):
            return
        subject, folder = self.people[len(self.enrolments)]
        rec = Enrolment(subject, self.count, round(self.clock(), 1))
        self.enrolments.append(rec)
        argv = [PEEP_EDGE, "enroll", "--config", str(self.config), "--subject", subject, "--source", str(folder),
                "--count", str(self.count), "--timeout", "60"]  # fmt: skip
        if self.niceness:
            argv = [NICE, "-n", str(self.niceness), *argv]
        proc = subprocess.run(argv, env=self.env, capture_output=True, timeout=180)
        with open(self.log, "ab") as out:
            out.write(proc.stderr)
        rec.rc = proc.returncode
        lines = (proc.stdout + proc.stderr).decode(errors="replace").strip().splitlines()
        rec.said = lines[-1][-300:] if lines else ""

    def check(self, dsn: str, ledger: Path) -> dict[str, Any]:
        """Per enrolment, the templates the server stored for that person against those the desk's own ledger
        says it released. An enrolment the desk refused for its input (too few faces in the photos: its
        ``--source`` error) is listed apart: the desk working, not the system failing."""
        import sqlite3

        import psycopg

        released: dict[str, int] = {}
        if ledger.exists():
            with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
                for key, n in db.execute("SELECT key, COUNT(*) FROM spends WHERE message_id != '' GROUP BY key"):
                    released[str(key).removeprefix("subject:")] = int(n)
        with psycopg.connect(dsn, connect_timeout=5) as c:
            for rec in self.enrolments:
                row = c.execute("SELECT COUNT(*) FROM templates WHERE subject = %s AND purpose = 'enroll'",
                                (rec.subject,)).fetchone()  # fmt: skip
                rec.stored = int(row[0]) if row else 0
        refused = [r for r in self.enrolments if r.rc != 0 and "--source" in r.said]
        failed = [r for r in self.enrolments if r.rc != 0 and r not in refused]
        return {
            "enrolments": len(self.enrolments),
            "succeeded": sum(1 for r in self.enrolments if r.rc == 0),
            "templates_released": sum(released.get(r.subject, 0) for r in self.enrolments),
            "templates_stored": sum(int(r.stored or 0) for r in self.enrolments),
            "mismatched": [r.subject for r in self.enrolments if r.stored != released.get(r.subject, 0)],
            "refused_input": [{"subject": r.subject, "said": r.said} for r in refused],
            "failed": [{"subject": r.subject, "at_s": r.at_s, "rc": r.rc, "said": r.said} for r in failed],
            "errors": self.errors[:5],
        }


def add_console_user(config: Path, name: str, env: dict[str, str]) -> str:
    """``peep console add-user`` on a replica's configuration; returns the one-time password it printed."""
    proc = subprocess.run([PEEP, "console", "add-user", "--config", str(config), "--name", name, "--role",
                           "operator"], env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"peep console add-user: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    lines = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    return lines[-1]


_CSRF = re.compile(r'name="csrf" value="([^"]*)"')
_EPS_ROW = re.compile(r"<tr>\s*<td>([A-Za-z0-9_.:@-]+)</td>(.*?)</tr>", re.S)
_EPS_TOTAL = re.compile(r'class="eps-total">([0-9.,]+)')
_EPS_REPORTED = re.compile(r'class="eps-reported">[^<]*?: ([0-9.,]+) over')


def device_row_text(devices_html: str, device: str, *, limit: int = 600) -> str:
    """The Devices page's row of ``device`` as text (tags dropped, at most ``limit`` characters): what a
    mismatch is reported with, so a run that failed says what the page held (releases, total, report)."""
    for dev, row in _EPS_ROW.findall(devices_html):
        if dev == device:
            return " ".join(re.sub(r"<[^>]*>", " ", row).split())[:limit]
    return ""


def shown_epsilon(devices_html: str) -> dict[str, float]:
    """Device id -> the Σ ε (per vector) the Devices page shows as that device's spend.

    The ε of the releases the server received; where the device's own report says it spent more (releases
    refused or still on their way), the page shows that too, and that is the device's spend.
    """
    out: dict[str, float] = {}
    for dev, row in _EPS_ROW.findall(devices_html):
        m = _EPS_REPORTED.search(row) or _EPS_TOTAL.search(row)
        if m:
            out[dev] = float(m.group(1).replace(",", ""))
    return out


@dataclass
class PageLoad:
    at_s: float
    page: str
    status: int | None
    ms: float
    error: str = ""


class ConsoleOperator(_Loop):
    """An operator on a replica's console: Live and Devices loaded every ``interval_s``.

    Logs in again whenever the console sends it to the login page (its replica restarted with its sessions
    in the database, or the session ended). ``loads`` keeps every page load; ``last_devices`` the last
    Devices page that loaded.
    """

    def __init__(self, url: str, ca: Path, name: str, one_time_password: str, *, interval_s: float,
                 clock: Callable[[], float], timeline: Timeline) -> None:  # fmt: skip
        super().__init__("soak-operator", interval_s)
        self.url, self.ca, self.name, self.clock, self.timeline = url, ca, name, clock, timeline
        self.password = one_time_password
        self.loads: list[PageLoad] = []
        self.last_devices = ""
        self.logins = 0
        self._client: Any = None

    def _new_client(self) -> Any:
        import httpx

        ctx = ssl.create_default_context(cafile=str(self.ca))
        return httpx.Client(base_url=self.url, verify=ctx, follow_redirects=False, timeout=15)

    def _csrf(self, path: str) -> str:
        m = _CSRF.search(self._client.get(path).text)
        if not m:
            raise RuntimeError(f"console: no csrf field on {path}")
        return m.group(1)

    def _login(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = self._new_client()
        r = self._client.post("/login", data={"name": self.name, "password": self.password,
                                              "csrf": self._csrf("/login")})  # fmt: skip
        if r.status_code != 303:
            raise RuntimeError(f"console login: HTTP {r.status_code}")
        if r.headers.get("location") == "/password":  # the one-time password: an operator sets their own
            new = f"soak-operator-{int(time.time())}-passphrase"
            form = {"current": self.password, "new": new, "again": new, "csrf": self._csrf("/password")}
            if self._client.post("/password", data=form).status_code != 303:
                raise RuntimeError("console: the password change was refused")
            self.password = new
            r = self._client.post("/login", data={"name": self.name, "password": new, "csrf": self._csrf("/login")})
            if r.status_code != 303:
                raise RuntimeError(f"console login after the password change: HTTP {r.status_code}")
        self.logins += 1

    def step(self) -> None:
        for page in ("/live", "/devices"):
            at = self.clock()
            t = time.monotonic()
            status: int | None = None
            error = ""
            try:
                if self._client is None:
                    self._login()
                r = self._client.get(page)
                if r.status_code == 303 and "/login" in r.headers.get("location", ""):
                    self._login()
                    r = self._client.get(page)
                status = r.status_code
                if page == "/devices" and status == 200:
                    self.last_devices = r.text
            except Exception as exc:  # a replica away: the load failed, the operator tries again
                error = f"{type(exc).__name__}: {str(exc)[:120]}"
                if self._client is not None:
                    self._client.close()
                self._client = None
            ms = (time.monotonic() - t) * 1000.0
            self.loads.append(PageLoad(round(at, 2), page, status, round(ms, 1), error))
            if status == 200:
                self.timeline.latency("console_page", self.timeline.now(), ms)

    def stop(self, timeout_s: float = 30.0) -> bool:
        ok = super().stop(timeout_s)
        self.close()
        return ok

    def close(self) -> None:
        """Close the connection; a later :meth:`step` logs in afresh (a closed client kept here made the run's
        final Devices page fail, and the ε check read an older one)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def summary(self) -> dict[str, Any]:
        ok = [x for x in self.loads if x.status == 200]
        return {
            "loads": len(self.loads),
            "ok": len(ok),
            "failed": len(self.loads) - len(ok),
            "logins": self.logins,
            "failures": [vars(x) for x in self.loads if x.status != 200][:20],
        }


@dataclass
class MidRunTraining:
    """A training run through the balancer at ``at_s``, its model made current; ``result`` what it said."""

    at_s: float
    result: dict[str, Any] = field(default_factory=dict)

    def run(self, stub_of: Callable[[], Any], metadata: list[tuple[str, str]], clock: Callable[[], float],
            *, give_up_s: float = 180.0) -> None:  # fmt: skip
        """Train and read the serving model; called again while the server answers UNAVAILABLE (a replica or
        the database away: what an operator does), for at most ``give_up_s``."""
        import grpc
        from peep.v1 import recognition_pb2

        self.result = {"at_s": round(clock(), 1), "attempts": 0}
        t = time.monotonic()
        while True:
            self.result["attempts"] += 1
            try:
                stub = stub_of()
                resp = stub.Train(recognition_pb2.TrainRequest(), metadata=metadata, timeout=600)
                self.result.update(model_version=resp.model_version, n_subjects=int(resp.n_subjects),
                                   n_templates=int(resp.n_templates))  # fmt: skip
                self.result.pop("error", None)
                self._serving(stub_of, metadata, resp.model_version)
                break
            except grpc.RpcError as exc:
                self.result["error"] = f"{exc.code().name}: {str(exc.details())[:200]}"
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() - t > give_up_s:
                    break
                time.sleep(2.0)
        self.result["took_s"] = round(time.monotonic() - t, 1)

    def _serving(self, stub_of: Callable[[], Any], metadata: list[tuple[str, str]], version: str) -> None:
        """Ask both replicas (the balancer spreads the calls) until each has served ``version`` twice in a row,
        for at most 30 s: ``serving`` is what the last answer said, ``promotion_s`` how long that took."""
        from peep.v1 import recognition_pb2

        t = time.monotonic()
        in_a_row = 0
        serving = ""
        while time.monotonic() - t < 30.0 and in_a_row < 4:
            try:
                status = stub_of().GetModelStatus(recognition_pb2.ModelStatusRequest(), metadata=metadata, timeout=10)
                serving = str(status.model_version)
            except Exception:  # a replica away meanwhile: ask again
                serving = ""
            in_a_row = in_a_row + 1 if serving == version else 0
            if in_a_row < 4:
                time.sleep(0.25)
        self.result.update(serving=serving, promotion_s=round(time.monotonic() - t, 2))


class DeadLetterFollower:
    """The server's dead-letter notes on the broker, read as its own account with a lasting session.

    A device publishing over MQTT deletes a template once the broker has it; when the server then refuses it
    (a clock far ahead, say), the note on ``<root>/deadletter`` is the refusal's only record. ``notes`` maps
    ``(device, message_id)`` to the refusal's code. The session outlives a broker restart (QoS 1, a fixed
    client id, no clean start), so notes published while this client was away still arrive.
    """

    def __init__(self, host: str, port: int, ca: Path, password: str, *, topic: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.notes: dict[tuple[str, str], str] = {}
        self.unnamed: list[str] = []
        self.topic = topic
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"soak-deadletters-{id(self):x}",
                                   protocol=mqtt.MQTTv5)  # fmt: skip
        self._client.username_pw_set("peep-server", password)
        self._client.tls_set(ca_certs=str(ca))
        self._client.reconnect_delay_set(1, 2)
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 3600 * 4
        self._props = props
        self._client.on_connect = lambda cl, *_a: cl.subscribe(topic, qos=1)
        self._client.on_message = self._on_message
        self._host, self._port = host, port

    def _on_message(self, _cl: Any, _u: Any, m: Any) -> None:
        import json

        try:
            doc = json.loads(m.payload)
        except ValueError:
            return
        parts = str(doc.get("topic", "")).split("/")
        device = parts[-2] if len(parts) >= 2 else ""
        mid = str(doc.get("message_id", ""))
        if mid:
            self.notes[(device, mid)] = str(doc.get("code", ""))[:64]
        elif len(self.unnamed) < 100:
            self.unnamed.append(str(doc.get("code", ""))[:64])

    def start(self) -> DeadLetterFollower:
        self._client.connect(self._host, self._port, keepalive=10, clean_start=False, properties=self._props)
        self._client.loop_start()
        return self

    def stop(self, timeout_s: float = 5.0) -> bool:
        self._client.disconnect()
        self._client.loop_stop()
        return True

    def of(self, device: str) -> dict[str, str]:
        """Message id -> the server's refusal code, for ``device``."""
        return {m: code for (d, m), code in list(self.notes.items()) if d == device}
