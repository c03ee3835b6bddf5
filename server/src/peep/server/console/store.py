"""The console's tables in the server's database (migration 5): accounts, sessions, alerts, audit log.

Written once for SQLite and PostgreSQL on the store's own primitives (``_session``, ``_transaction`` and
its :class:`~peep.server.storage.dialect.Dialect`), like the rest of :mod:`peep.server.storage`, so
replicas on one PostgreSQL share accounts, sessions and acknowledgements. The read-only summaries the
pages show (devices, subjects, ε spent) are here too: they are plain aggregates over the ingest ledger and
``templates``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peep.server.storage.sql import SqlStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Account:
    name: str
    role: str
    password_hash: str
    must_change: bool
    disabled: bool
    created_at: float


@dataclass(frozen=True)
class Session:
    name: str
    role: str
    csrf: str
    expires_at: float
    must_change: bool


@dataclass(frozen=True)
class Alert:
    event_id: str
    at: float
    site: str
    device_id: str
    probability: float
    model_version: str
    acknowledged_by: str | None
    acknowledged_at: float | None


@dataclass(frozen=True)
class AlertGroup:
    """The open unknown-face alerts of one device in one time window (the Live page lists these, not rows)."""

    device_id: str
    site: str
    window_start: float
    window_s: float
    n: int
    first: float
    last: float
    max_probability: float


@dataclass(frozen=True)
class Recognition:
    """One kept decision as the Live page lists it (``id`` increases with each decision written)."""

    id: int
    event_id: str
    at: float
    site: str
    device_id: str
    track_id: str
    purpose: str
    subject: str
    unknown: bool
    accepted: bool | None
    probability: float
    model_version: str
    #: A door opened at another's request (``home_assistant``), not by a claim: it names no subject.
    requested_by: str = ""


#: The decisions the Live page filters by: what each means in ``recognition_events``.
DECISIONS: dict[str, str] = {
    "named": "purpose = 'identify' AND unknown = 0",
    "unknown": "purpose = 'identify' AND unknown = 1",
    "accepted": "purpose = 'verify' AND accepted = 1",
    "refused": "purpose = 'verify' AND accepted = 0",
}


@dataclass(frozen=True)
class AuditEntry:
    at: float
    actor: str
    action: str
    target: str
    outcome: str
    address: str
    id: int = 0


@dataclass(frozen=True)
class DeviceSummary:
    """One device's releases as the ingest ledger counts them (the Devices and Privacy pages).

    ``releases``, the ε sums and ``last_release`` are the device's own: what it sent with its own
    credential or on its own MQTT topic. What the administrator sent in its name (public background
    faces enrolled through a desk) is counted apart, in ``admin_releases`` and ``admin_epsilon_vector_total``:
    the device released none of it and its own ledger holds none of it.
    """

    device_id: str
    site: str
    releases: int
    epsilon_vector_total: float
    epsilon_vector_max_track: float
    #: The latest of its own releases (Unix time); None when the administrator sent all there is.
    last_release: float | None
    bundle_id: str
    mechanism_kind: str
    epsilon_coordinate: float
    epsilon_vector: float
    #: The soft-trait releases' share of ``epsilon_vector_total`` (which is the whole spend: templates + traits).
    epsilon_traits_total: float = 0.0
    #: ``{transport: releases}`` of its own releases (``grpc``, ``mqtt``; "" for rows from before it was recorded).
    transports: Mapping[str, int] = field(default_factory=dict)
    #: Templates sent in its name with the administrator's credential (e.g. ``peep-edge enroll-background``).
    admin_releases: int = 0
    #: Their ε per vector (templates + soft traits), not in ``epsilon_vector_total``.
    admin_epsilon_vector_total: float = 0.0


_ACCOUNTS = "SELECT name, role, password_hash, must_change, disabled, created_at FROM console_users"
#: ``ingest_ledger.sent_by`` of rows sent with the administrator's credential (the ingestor's ``Sender.sent_by``).
ADMIN = "admin"


def _account(row: Any, *, with_hash: bool = True) -> Account:
    return Account(str(row[0]), str(row[1]), str(row[2]) if with_hash else "", bool(row[3]), bool(row[4]),
                   float(row[5]))  # fmt: skip


class ConsoleStore:
    """The console's reads and writes on a :class:`~peep.server.storage.sql.SqlStore`.

    Parameters
    ----------
    store : SqlStore
        The server's store (already migrated: it opens with every migration applied).
    clock : callable, optional
        Wall-clock seconds (injected for tests).
    """

    def __init__(self, store: Any, *, clock: Any = time.time) -> None:
        if not isinstance(store, SqlStore):
            raise TypeError(f"store: expected a SQL store (SQLite or PostgreSQL), received {type(store).__name__}")
        self.store = store
        self._p = store._sql.param
        # The hour of a time: SQLite's CAST truncates (times are positive), PostgreSQL's rounds, so it floors.
        self._hour = "CAST(received_at / 3600 AS INTEGER)" if store.dialect == "sqlite" else "FLOOR(received_at / 3600)"
        self._clock = clock

    # ------------------------------------------------------------ accounts

    def add_account(self, name: str, role: str, password_hash: str, *, must_change: bool = True) -> None:
        """Create an account, or raise ValueError naming it if it exists."""
        p = self._p
        # One statement, not a check then an insert: on PostgreSQL another replica's insert of the same name
        # between the two passed the check and failed the insert with the driver's unique violation.
        with self.store._session() as conn:
            n = conn.execute(
                "INSERT INTO console_users (name, role, password_hash, must_change, disabled, created_at) "
                f"VALUES ({p}, {p}, {p}, {p}, 0, {p}) ON CONFLICT (name) DO NOTHING",
                (name, role, password_hash, int(must_change), self._clock()),
            ).rowcount
        if n != 1:
            raise ValueError(f"name: expected a new account name, received {name!r} (it exists)")

    def reset_password(self, name: str, password_hash: str, *, must_change: bool) -> bool:
        """Replace an account's password hash and end its sessions; False if there is no such account."""
        p = self._p
        with self.store._transaction() as conn:
            n = conn.execute(
                f"UPDATE console_users SET password_hash = {p}, must_change = {p} WHERE name = {p}",
                (password_hash, int(must_change), name),
            ).rowcount
            conn.execute(f"DELETE FROM console_sessions WHERE name = {p}", (name,))
        return bool(n)

    def account(self, name: str) -> Account | None:
        with self.store._session() as conn:
            row = conn.execute(f"{_ACCOUNTS} WHERE name = {self._p}", (name,)).fetchone()
        return None if row is None else _account(row)

    def accounts(self) -> list[Account]:
        """Every account, by name, without password hashes (listing needs none)."""
        with self.store._session() as conn:
            rows = conn.execute(f"{_ACCOUNTS} ORDER BY name").fetchall()
        return [_account(r, with_hash=False) for r in rows]

    # ------------------------------------------------------------ sessions

    def create_session(self, id_sha256: str, name: str, csrf: str, *, lifetime_s: float) -> None:
        p = self._p
        now = self._clock()
        with self.store._transaction() as conn:
            conn.execute(f"DELETE FROM console_sessions WHERE expires_at < {p}", (now,))
            conn.execute(
                "INSERT INTO console_sessions (id_sha256, name, csrf, created_at, expires_at, last_seen) "
                f"VALUES ({p}, {p}, {p}, {p}, {p}, {p})",
                (id_sha256, name, csrf, now, now + lifetime_s, now),
            )

    def session(self, id_sha256: str, *, idle_s: float) -> Session | None:
        """The live session with this id digest (touching it), or None if absent, expired, idle or disabled."""
        p = self._p
        now = self._clock()
        q = (
            "SELECT s.name, u.role, s.csrf, s.expires_at, s.last_seen, u.must_change, u.disabled "
            f"FROM console_sessions s JOIN console_users u ON u.name = s.name WHERE s.id_sha256 = {p}"
        )
        with self.store._session() as conn:
            row = conn.execute(q, (id_sha256,)).fetchone()
            if row is None:
                return None
            if float(row[3]) <= now or float(row[4]) + idle_s <= now or bool(row[6]):
                conn.execute(f"DELETE FROM console_sessions WHERE id_sha256 = {p}", (id_sha256,))
                return None
            if now - float(row[4]) > 5.0:  # one write per few seconds, not one per request
                conn.execute(f"UPDATE console_sessions SET last_seen = {p} WHERE id_sha256 = {p}", (now, id_sha256))
        return Session(str(row[0]), str(row[1]), str(row[2]), float(row[3]), bool(row[5]))

    def end_session(self, id_sha256: str) -> None:
        with self.store._session() as conn:
            conn.execute(f"DELETE FROM console_sessions WHERE id_sha256 = {self._p}", (id_sha256,))

    # ------------------------------------------------------------ alerts

    def add_alert(self, event_id: str, at: float, site: str, device_id: str, probability: float, version: str) -> None:
        p = self._p
        with self.store._session() as conn:
            conn.execute(
                "INSERT INTO console_alerts (event_id, at, site, device_id, probability, model_version) "
                f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}) ON CONFLICT (event_id) DO NOTHING",
                (event_id, at, site, device_id, probability, version),
            )

    def alerts(self, *, open_only: bool = True, site: str = "", device_id: str = "", limit: int = 100) -> list[Alert]:
        p = self._p
        where, params = [], []
        if open_only:
            where.append("acknowledged_at IS NULL")
        if site:
            where.append(f"site = {p}")
            params.append(site)
        if device_id:
            where.append(f"device_id = {p}")
            params.append(device_id)
        q = (
            "SELECT event_id, at, site, device_id, probability, model_version, acknowledged_by, acknowledged_at "
            "FROM console_alerts" + (" WHERE " + " AND ".join(where) if where else "") + f" ORDER BY at DESC LIMIT {p}"
        )
        with self.store._session() as conn:
            rows = conn.execute(q, [*params, limit]).fetchall()
        return [
            Alert(
                str(r[0]),
                float(r[1]),
                str(r[2]),
                str(r[3]),
                float(r[4]),
                str(r[5]),
                None if r[6] is None else str(r[6]),
                None if r[7] is None else float(r[7]),
            )
            for r in rows
        ]

    def _bucket(self, column: str, width: float) -> str:
        # SQLite's CAST truncates (times are positive), PostgreSQL's rounds, so it floors.
        w = float(width)
        if self.store.dialect == "sqlite":
            return f"CAST({column} / {w!r} AS INTEGER)"
        return f"FLOOR({column} / {w!r})"

    def _alert_where(
        self, *, site: str, device_id: str, since: float | None, before: float | None
    ) -> tuple[list[str], list[object]]:
        p = self._p
        where: list[str] = ["acknowledged_at IS NULL"]
        params: list[object] = []
        for column, value in (("site", site), ("device_id", device_id)):
            if value:
                where.append(f"{column} = {p}")
                params.append(value)
        if since is not None:
            where.append(f"at >= {p}")
            params.append(since)
        if before is not None:
            where.append(f"at < {p}")
            params.append(before)
        return where, params

    def alert_groups(
        self,
        *,
        window_s: float = 3600.0,
        site: str = "",
        device_id: str = "",
        since: float | None = None,
        limit: int = 20,
        offset: int = 0,
    ) -> tuple[list[AlertGroup], int]:
        """Open alerts grouped by device and ``window_s`` window, newest window first, and how many groups in all.

        A day of a busy entrance is hundreds of unknown faces: an operator reads (and acknowledges) a
        device's hour at a time, not a row per face.
        """
        p = self._p
        where, params = self._alert_where(site=site, device_id=device_id, since=since, before=None)
        b = self._bucket("at", window_s)
        grouped = (
            f"SELECT device_id, MIN(site) AS site, {b} AS w, COUNT(*) AS n, MIN(at) AS first, MAX(at) AS last, "
            f"MAX(probability) AS top FROM console_alerts WHERE {' AND '.join(where)} GROUP BY device_id, {b}"
        )
        with self.store._session() as conn:
            (total,) = conn.execute(f"SELECT COUNT(*) FROM ({grouped}) g", params).fetchone()
            rows = conn.execute(
                f"{grouped} ORDER BY w DESC, device_id LIMIT {p} OFFSET {p}", [*params, limit, offset]
            ).fetchall()
        groups = [
            AlertGroup(str(d), str(s), float(w) * window_s, window_s, int(n), float(a), float(z), float(top))
            for d, s, w, n, a, z, top in rows
        ]
        return groups, int(total)

    def count_alerts(self, *, site: str = "", device_id: str = "") -> int:
        """Open alerts matching the filters."""
        where, params = self._alert_where(site=site, device_id=device_id, since=None, before=None)
        with self.store._session() as conn:
            (n,) = conn.execute(f"SELECT COUNT(*) FROM console_alerts WHERE {' AND '.join(where)}", params).fetchone()
        return int(n)

    def acknowledge_many(
        self,
        name: str,
        *,
        site: str = "",
        device_id: str = "",
        since: float | None = None,
        before: float | None = None,
    ) -> int:
        """Acknowledge every open alert matching the filters (``since <= at < before``); returns how many."""
        p = self._p
        where, params = self._alert_where(site=site, device_id=device_id, since=since, before=before)
        with self.store._session() as conn:
            n = conn.execute(
                f"UPDATE console_alerts SET acknowledged_by = {p}, acknowledged_at = {p} WHERE {' AND '.join(where)}",
                [name, self._clock(), *params],
            ).rowcount
        return int(n)

    def acknowledge(self, event_id: str, name: str) -> bool:
        """Mark an open alert acknowledged by ``name``; False if there is no such open alert."""
        p = self._p
        with self.store._session() as conn:
            n = conn.execute(
                f"UPDATE console_alerts SET acknowledged_by = {p}, acknowledged_at = {p} "
                f"WHERE event_id = {p} AND acknowledged_at IS NULL",
                (name, self._clock(), event_id),
            ).rowcount
        return bool(n)

    # ------------------------------------------------------------ failed logins (the throttle)

    def login_failures(self, kind: str, value: str, since: float) -> list[float]:
        """Times of the failed logins of one key (``kind`` ``account`` or ``address``) after ``since``, oldest first."""
        p = self._p
        q = f"SELECT at FROM console_login_failures WHERE kind = {p} AND value = {p} AND at > {p} ORDER BY at"
        with self.store._session() as conn:
            return [float(r[0]) for r in conn.execute(q, (kind, value[:64], since))]

    def add_login_failure(
        self, keys: Sequence[tuple[str, str]], at: float, *, older_than: float, max_rows: int
    ) -> None:
        """Record one failure under each key; forget failures before ``older_than`` and beyond ``max_rows``."""
        p = self._p
        with self.store._transaction() as conn:
            conn.execute(f"DELETE FROM console_login_failures WHERE at <= {p}", (older_than,))
            for kind, value in keys:
                conn.execute(
                    f"INSERT INTO console_login_failures (kind, value, at) VALUES ({p}, {p}, {p})",
                    (kind, value[:64], at),
                )
            (n,) = conn.execute("SELECT COUNT(*) FROM console_login_failures").fetchone()
            if int(n) > max_rows:  # a flood of names: the oldest failures go first
                conn.execute(
                    "DELETE FROM console_login_failures WHERE at <= (SELECT at FROM console_login_failures "
                    f"ORDER BY at LIMIT 1 OFFSET {p})",
                    (int(n) - max_rows,),
                )

    def clear_login_failures(self, kind: str, value: str | None = None) -> None:
        """Forget the failures of one key (``value`` None: of every key of ``kind``)."""
        p = self._p
        with self.store._session() as conn:
            if value is None:
                conn.execute(f"DELETE FROM console_login_failures WHERE kind = {p}", (kind,))
            else:
                conn.execute(f"DELETE FROM console_login_failures WHERE kind = {p} AND value = {p}", (kind, value[:64]))

    # ------------------------------------------------------------ audit log

    def audit(self, actor: str, action: str, target: str, outcome: str, address: str) -> None:
        """Record one action (who, what, on what, how it ended, from where, when)."""
        p = self._p
        with self.store._session() as conn:
            conn.execute(
                "INSERT INTO console_audit (at, actor, action, target, outcome, address) "
                f"VALUES ({p}, {p}, {p}, {p}, {p}, {p})",
                (self._clock(), actor[:64], action[:64], target[:300], outcome[:300], address[:64]),
            )

    def audit_log(
        self,
        *,
        limit: int = 200,
        actor: str = "",
        action: str = "",
        outcome: str = "",
        before_id: int | None = None,
    ) -> list[AuditEntry]:
        """The newest entries matching the filters, newest first (``before_id``: the page after that entry).

        ``actor`` and ``action`` match exactly; ``outcome`` is a case-insensitive substring (outcomes are
        sentences such as ``refused: not confirmed``).
        """
        p = self._p
        q = "SELECT at, actor, action, target, outcome, address, id FROM console_audit"
        where: list[str] = []
        params: list[object] = []
        if actor:
            where.append(f"actor = {p}")
            params.append(actor)
        if action:
            where.append(f"action = {p}")
            params.append(action)
        if outcome:
            # LIKE's wildcards in the operator's text are literal here.
            escaped = outcome.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append(f"LOWER(outcome) LIKE {p} ESCAPE '\\'")
            params.append(f"%{escaped}%")
        if before_id is not None:
            where.append(f"id < {p}")
            params.append(before_id)
        if where:
            q += " WHERE " + " AND ".join(where)
        q += f" ORDER BY id DESC LIMIT {p}"
        with self.store._session() as conn:
            rows = conn.execute(q, [*params, limit]).fetchall()
        return [AuditEntry(float(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), str(r[5]), int(r[6])) for r in rows]

    def audit_actions(self) -> list[str]:
        """The distinct actions in the audit log (the filter's choices)."""
        with self.store._session() as conn:
            return [str(a) for (a,) in conn.execute("SELECT DISTINCT action FROM console_audit ORDER BY action")]

    def audit_actors(self) -> list[str]:
        """The distinct actors in the audit log (accounts, and names tried at login)."""
        with self.store._session() as conn:
            return [str(a) for (a,) in conn.execute("SELECT DISTINCT actor FROM console_audit ORDER BY actor")]

    # ------------------------------------------------------------ recognitions (kept decisions)

    def _recognition_where(
        self, *, since: float | None, site: str, device_id: str, decision: str, before_id: int | None
    ) -> tuple[str, list[object]]:
        p = self._p
        where: list[str] = []
        params: list[object] = []
        if since is not None:
            where.append(f"at >= {p}")
            params.append(since)
        for column, value in (("site", site), ("device_id", device_id)):
            if value:
                where.append(f"{column} = {p}")
                params.append(value)
        if decision:
            if decision not in DECISIONS:
                raise ValueError(f"decision: expected one of {', '.join(DECISIONS)}, received {decision[:32]!r}")
            where.append(f"({DECISIONS[decision]})")
        if before_id is not None:
            where.append(f"id < {p}")
            params.append(before_id)
        return (" WHERE " + " AND ".join(where)) if where else "", params

    def recognitions(
        self,
        *,
        since: float | None = None,
        site: str = "",
        device_id: str = "",
        decision: str = "",
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[Recognition]:
        """Kept decisions (``recognition_events``) matching the filters, newest first.

        The database, not the Live feed's memory, so a page reaches back over every decision kept
        (``recognition.events_days``), whichever replica made it.
        """
        where, params = self._recognition_where(
            since=since, site=site, device_id=device_id, decision=decision, before_id=before_id
        )
        q = (
            "SELECT id, event_id, at, site, device_id, track_id, purpose, subject, claimed_subject, unknown, "
            f"accepted, probability, model_version, requested_by FROM recognition_events{where} ORDER BY id DESC "
            f"LIMIT {self._p}"
        )
        with self.store._session() as conn:
            rows = conn.execute(q, [*params, limit]).fetchall()
        out = []
        for i, eid, at, site_, dev, track, purpose, subject, claimed, unknown, accepted, prob, version, asked in rows:
            verify = purpose == "verify"
            # A verification is listed under the claimed subject (the model's subject is not what was asked).
            shown_subject = str(claimed if verify else subject)
            acc = None if accepted is None else bool(accepted)
            item = Recognition(
                int(i), str(eid), float(at), str(site_), str(dev), str(track), str(purpose), shown_subject,
                bool(unknown) and not verify, acc, float(prob), str(version), str(asked or ""),
            )  # fmt: skip
            out.append(item)
        return out

    def count_recognitions(
        self, *, since: float | None = None, site: str = "", device_id: str = "", decision: str = ""
    ) -> int:
        """How many kept decisions match the filters."""
        where, params = self._recognition_where(
            since=since, site=site, device_id=device_id, decision=decision, before_id=None
        )
        with self.store._session() as conn:
            (n,) = conn.execute(f"SELECT COUNT(*) FROM recognition_events{where}", params).fetchone()
        return int(n)

    def recognition_sites_and_devices(self) -> tuple[list[str], list[str]]:
        """The sites and devices of kept decisions (the filters' choices)."""
        with self.store._session() as conn:
            sites = [str(s) for (s,) in conn.execute("SELECT DISTINCT site FROM recognition_events ORDER BY site")]
            devs = [str(d) for (d,) in conn.execute("SELECT DISTINCT device_id FROM recognition_events ORDER BY 1")]
        return sites, devs

    # ------------------------------------------------------------ summaries of templates

    def devices(self) -> list[DeviceSummary]:
        """Per device: releases, ε per vector spent in total and on its most-released track, the latest release.

        From the ingest ledger (every received template's ids, times and ε, kept for the de-duplication
        window), not from templates: identify/verify templates are decided and forgotten. Every ε sum is the
        whole spend: the template's, its soft-trait releases' (sequential composition) and, for a decision made on
        the device, its label's (``epsilon_label``; its template ε are 0). The sums, the track
        and the latest release count the device's own releases; what the administrator sent in its name is
        summed apart (:class:`DeviceSummary`). The mechanism shown is that of the device's latest row.
        """
        own = f"sent_by != '{ADMIN}'"
        # One scan for the counts, sums and transports (a month of a busy site's rows): grouped by how each row
        # came and whose credential sent it, then added up here.
        q = (
            "SELECT device_id, transport, sent_by, COUNT(*), SUM(epsilon_vector + epsilon_traits + epsilon_label), "
            "MAX(received_at), SUM(epsilon_traits) FROM ingest_ledger GROUP BY device_id, transport, sent_by"
        )
        q_track = (
            "SELECT device_id, MAX(total) FROM (SELECT device_id, track_id, "
            "SUM(epsilon_vector + epsilon_traits + epsilon_label) AS total FROM ingest_ledger "
            f"WHERE {own} GROUP BY device_id, track_id) t GROUP BY device_id"
        )
        q_last = (
            "SELECT t.device_id, t.site, t.bundle_id, t.mechanism_kind, t.epsilon_coordinate, t.epsilon_vector "
            "FROM ingest_ledger t JOIN (SELECT device_id, MAX(received_at) AS last FROM ingest_ledger "
            "GROUP BY device_id) m ON m.device_id = t.device_id AND m.last = t.received_at"
        )
        with self.store._session() as conn:
            groups = conn.execute(q).fetchall()
            per_track = {str(d): float(v or 0.0) for d, v in conn.execute(q_track)}
            last = {str(r[0]): r for r in conn.execute(q_last)}
        own_rows: dict[str, list[Any]] = {}  # device: [releases, Σ ε, latest, Σ ε traits]
        transports: dict[str, dict[str, int]] = {}
        admin: dict[str, list[Any]] = {}  # device: [releases, Σ ε]
        for d, transport, sent_by, n, eps, at, traits in groups:
            dev = str(d)
            if sent_by == ADMIN:
                a = admin.setdefault(dev, [0, 0.0])
                a[0] += int(n)
                a[1] += float(eps or 0.0)
                continue
            o = own_rows.setdefault(dev, [0, 0.0, None, 0.0])
            o[0] += int(n)
            o[1] += float(eps or 0.0)
            o[2] = float(at) if o[2] is None else max(o[2], float(at))
            o[3] += float(traits or 0.0)
            by_transport = transports.setdefault(dev, {})
            by_transport[str(transport)] = by_transport.get(str(transport), 0) + int(n)
        out = []
        for d in sorted(set(own_rows) | set(admin)):
            n, eps, at, traits = own_rows.get(d, (0, 0.0, None, 0.0))
            ln = last.get(d, (d, "", "", "", 0.0, 0.0))
            by_admin = admin.get(d, (0, 0.0))
            out.append(
                DeviceSummary(
                    d,
                    str(ln[1]),
                    int(n),
                    float(eps),
                    per_track.get(d, 0.0),
                    at,
                    str(ln[2]),
                    str(ln[3]),
                    float(ln[4]),
                    float(ln[5]),
                    float(traits),
                    transports.get(d, {}),
                    int(by_admin[0]),
                    float(by_admin[1]),
                )
            )
        return out

    def subjects(self, *, limit: int = 1000) -> list[tuple[str, int, float]]:
        """(subject, enrolment templates, latest received) per enrolled subject, by name."""
        q = (
            "SELECT subject, COUNT(*), MAX(received_at) FROM templates WHERE subject IS NOT NULL "
            f"AND purpose = 'enroll' GROUP BY subject ORDER BY subject LIMIT {self._p}"
        )
        with self.store._session() as conn:
            return [(str(s), int(n), float(t)) for s, n, t in conn.execute(q, (limit,))]

    def open_tracks(self, *, limit: int = 50) -> list[tuple[str, str, str, int, float]]:
        """(device, site, track, templates, latest) of recent tracks with templates not enrolled to anyone."""
        q = (
            "SELECT device_id, site, track_id, COUNT(*), MAX(received_at) FROM templates WHERE subject IS NULL "
            f"GROUP BY device_id, site, track_id ORDER BY MAX(received_at) DESC LIMIT {self._p}"
        )
        with self.store._session() as conn:
            return [(str(d), str(s), str(t), int(n), float(at)) for d, s, t, n, at in conn.execute(q, (limit,))]

    def track_keys(self, device_id: str, track_id: str, *, limit: int) -> list[tuple[str, str]]:
        """(device_id, message_id) of a track's templates not enrolled to anyone (at most ``limit``)."""
        p = self._p
        q = (
            f"SELECT device_id, message_id FROM templates WHERE device_id = {p} AND track_id = {p} "
            f"AND subject IS NULL ORDER BY received_at LIMIT {p}"
        )
        with self.store._session() as conn:
            return [(str(d), str(m)) for d, m in conn.execute(q, (device_id, track_id, limit))]

    def hourly(self, since: float, *, purposes: Sequence[str] = ("identify", "verify")) -> list[tuple[int, int]]:
        """(hour index since the epoch, templates received) for recognitions since ``since``."""
        of, params = self.store._sql.any_of("purpose", list(purposes))
        q = (
            f"SELECT {self._hour} AS h, COUNT(*) FROM ingest_ledger WHERE received_at >= "
            f"{self._p} AND {of} GROUP BY {self._hour} ORDER BY h"
        )
        with self.store._session() as conn:
            return [(int(h), int(n)) for h, n in conn.execute(q, [since, *params])]

    def epsilon_by_device_hour(self, since: float, *, bucket_s: float = 3600.0) -> list[tuple[str, int, float]]:
        """(device, bucket index, ε per vector spent in it: templates + soft traits + decision labels) since ``since``.

        The bucket of a time ``t`` is ``floor(t / bucket_s)`` (hours by default). The device's own releases
        only, as in :meth:`devices`.
        """
        b = self._bucket("received_at", bucket_s)
        q = (
            f"SELECT device_id, {b} AS h, SUM(epsilon_vector + epsilon_traits + epsilon_label) FROM ingest_ledger "
            f"WHERE received_at >= {self._p} AND sent_by != '{ADMIN}' GROUP BY device_id, {b} ORDER BY h"
        )
        with self.store._session() as conn:
            return [(str(d), int(h), float(e)) for d, h, e in conn.execute(q, (since,))]

    def ledger_span(self, since: float) -> tuple[float, float] | None:
        """(first, last) receipt time of devices' own releases in the ledger since ``since``, or None when none.

        The span :meth:`epsilon_by_device_hour` charts (what the administrator sent is not in that chart).
        """
        q = (
            "SELECT MIN(received_at), MAX(received_at) FROM ingest_ledger "
            f"WHERE received_at >= {self._p} AND sent_by != '{ADMIN}'"
        )
        with self.store._session() as conn:
            row = conn.execute(q, (since,)).fetchone()
        return None if row is None or row[0] is None else (float(row[0]), float(row[1]))


class KeptChoices:
    """The sites and devices of the kept decisions (Live's filter choices), read off the request path.

    Reading them scans every kept decision (``SELECT DISTINCT`` over ``recognition_events``: 0.8 s a column
    over 3 million rows on a 2-core x86 box, several times that on a Raspberry Pi) — a month of a busy site's
    decisions. A thread reads them every ``interval`` seconds; a page takes the last reading (empty until the
    first), which Live joins with the live feed's and the configured devices, so a new one shows at once.

    Parameters
    ----------
    read : callable
        ``() -> (sites, devices)`` (:meth:`ConsoleStore.recognition_sites_and_devices`).
    interval : float
        Seconds between readings.
    """

    def __init__(self, read: Callable[[], tuple[list[str], list[str]]], *, interval: float = 600.0) -> None:
        if not interval > 0:
            raise ValueError(f"interval: expected seconds > 0, received {interval!r}")
        self._read = read
        self.interval = float(interval)
        self._value: tuple[list[str], list[str]] = ([], [])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peep-console-choices", daemon=True)
        self.readings = 0

    def start(self) -> KeptChoices:
        self._thread.start()
        return self

    def refresh(self) -> None:
        """Read them now (the thread does this every ``interval``)."""
        self._value = self._read()
        self.readings += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # the database away: the last reading stands, the next one retries
                log.warning("console: filter choices not read", extra={"error": str(exc)[:200]})
            self._stop.wait(self.interval)

    def get(self) -> tuple[list[str], list[str]]:
        """The last reading: (sites, devices)."""
        return self._value

    def stop(self) -> None:
        self._stop.set()
