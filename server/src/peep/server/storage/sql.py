"""The template store's SQL, written once for SQLite and PostgreSQL.

:class:`SqlStore` implements :class:`~peep.server.storage.Store` on two
primitives that a subclass supplies: ``_session()``, a connection whose
statements each commit on their own, and ``_transaction()``, a connection
inside one transaction. The subclasses add only what genuinely differs:
connecting, keeping concurrent migrations apart, the idempotent batch insert
and closing. A :class:`~peep.server.storage.dialect.Dialect` fills in the
placeholders and the form of ``IN`` lists.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

import numpy as np
from peep.server.storage.dialect import Dialect
from peep.server.storage.interface import StoreError
from peep.server.storage.migrations import MIGRATIONS, SCHEMA_TABLE, migrate
from peep.server.storage.records import (
    COLUMNS,
    DECISION_COLUMNS,
    TRACK_COLUMNS,
    DecisionRecord,
    EnrolmentSet,
    IngestBatch,
    KeptCounts,
    LedgerEntry,
    ReplicaHolder,
    ShownPerson,
    TemplateRecord,
    TrackRelease,
    check_display_name,
    stack_blobs,
)

#: LISTEN/NOTIFY channels (PostgreSQL): a promotion (payload: the version) and an erasure (no payload).
MODELS_CHANNEL = "peep_models"
ERASURES_CHANNEL = "peep_erasures"
#: Notified when decisions commit: the other replicas read the log of decisions from their last id.
EVENTS_CHANNEL = "peep_events"


class Cursor(Protocol):
    """What the stores use of a DB-API cursor (sqlite3's and psycopg's)."""

    @property
    def rowcount(self) -> int: ...
    @property
    def description(self) -> Sequence[Sequence[Any]] | None: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What the stores use of a DB-API connection (sqlite3's and psycopg's)."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Cursor: ...


class SqlStore(ABC):
    """:class:`~peep.server.storage.Store` on a SQL database; subclasses bind it to one."""

    dialect: str
    #: How this database spells what the SQL below leaves open.
    _sql: ClassVar[Dialect]
    #: How error messages name the database (the configuration key it comes from).
    _source: str

    # ------------------------------------------------------------ what a subclass supplies

    @abstractmethod
    def _session(self) -> AbstractContextManager[Connection]:
        """A connection whose statements commit one by one."""

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Connection]:
        """A connection in one transaction, committed at the end of the block, rolled back if it raises."""

    @abstractmethod
    def _lock_schema(self, conn: Connection) -> None:
        """Keep other processes from migrating until ``conn``'s transaction ends."""

    @abstractmethod
    def insert_templates(self, records: Sequence[TemplateRecord]) -> list[bool]:
        """See :meth:`peep.server.storage.Store.insert_templates`."""

    @abstractmethod
    def _insert_template_rows(self, conn: Connection, records: Sequence[TemplateRecord]) -> set[tuple[str, str]]:
        """Insert ``records`` on ``conn`` (in its transaction) unless their key is stored; returns the keys inserted."""

    @abstractmethod
    def _insert_ledger(self, conn: Connection, entries: Sequence[LedgerEntry]) -> set[tuple[str, str]]:
        """Insert ``entries`` (unique keys) on ``conn`` unless already in the ledger; returns the keys inserted."""

    @abstractmethod
    def _executemany(self, conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run ``sql`` once per row on ``conn``."""

    @abstractmethod
    def close(self) -> None: ...

    def _notify(self, conn: Connection, channel: str, payload: str) -> None:
        """Tell the other processes on this database, when ``conn``'s transaction commits (PostgreSQL)."""
        return None  # SQLite: one node, nobody to tell

    def _lock_models(self, conn: Connection) -> None:
        """Keep other processes from promoting until ``conn``'s transaction ends (SQLite: BEGIN IMMEDIATE does)."""
        return None

    def _lock_events(self, conn: Connection) -> None:
        """Make ``conn``'s decisions commit after every decision with a smaller id (SQLite: one writer does).

        Taken just before the decisions are inserted and held to the commit, so the ids of
        ``recognition_events`` are in commit order: a reader resuming from the last id it saw misses nothing.
        """
        return None

    # ------------------------------------------------------------ schema

    def _migrate(self) -> None:
        with self._transaction() as conn:
            self._lock_schema(conn)
            migrate(conn, MIGRATIONS[self.dialect], self._sql, source=self._source)

    def schema_version(self) -> int:
        with self._session() as conn:
            row = conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {SCHEMA_TABLE}").fetchone()
        return int(row[0]) if row else 0

    # ------------------------------------------------------------ templates

    def get_template(self, message_id: str, *, device_id: str | None = None) -> TemplateRecord | None:
        p = self._sql.param
        q = f"SELECT {', '.join(COLUMNS)} FROM templates WHERE message_id = {p}"
        params: list[object] = [message_id]
        if device_id is not None:
            q += f" AND device_id = {p}"
            params.append(device_id)
        with self._session() as conn:
            cur = conn.execute(q + " ORDER BY received_at, device_id LIMIT 1", params)
            row = cur.fetchone()
            names = [d[0] for d in cur.description or ()]
        return None if row is None else TemplateRecord.from_row(dict(zip(names, row, strict=True)))

    def devices_of(self, message_ids: Sequence[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        with self._session() as conn:
            for chunk in self._sql.chunks(list(dict.fromkeys(message_ids))):
                of_ids, params = self._sql.any_of("message_id", chunk)
                q = f"SELECT message_id, device_id FROM templates WHERE {of_ids} ORDER BY message_id, device_id"
                for mid, dev in conn.execute(q, params):
                    out.setdefault(str(mid), []).append(str(dev))
        return out

    def count_templates(
        self, *, subject: str | None = None, bundle_id: str | None = None, purpose: str | None = None
    ) -> int:
        where, params = [], []
        for col, val in (("subject", subject), ("bundle_id", bundle_id), ("purpose", purpose)):
            if val is not None:
                where.append(f"{col} = {self._sql.param}")
                params.append(val)
        q = "SELECT COUNT(*) FROM templates" + (" WHERE " + " AND ".join(where) if where else "")
        with self._session() as conn:
            row = conn.execute(q, params).fetchone()
        return int(row[0]) if row else 0

    def enrolment_kinds(self, bundle_id: str) -> dict[str, int]:
        q = (
            f"SELECT mechanism_kind, COUNT(*) FROM templates WHERE bundle_id = {self._sql.param} "
            "AND purpose = 'enroll' AND subject IS NOT NULL GROUP BY mechanism_kind"
        )
        with self._session() as conn:
            return {k: int(n) for k, n in conn.execute(q, (bundle_id,))}

    def enrolment_set(self, bundle_id: str, kinds: Sequence[str], key_id: str | None = None) -> EnrolmentSet:
        of_kinds, params = self._sql.any_of("mechanism_kind", kinds)
        of_key = "" if key_id is None else f" AND key_id = {self._sql.param}"
        q = (
            "SELECT message_id, subject, mechanism_kind, n_components, vals FROM templates "
            f"WHERE bundle_id = {self._sql.param} AND purpose = 'enroll' AND subject IS NOT NULL AND {of_kinds}"
            f"{of_key} ORDER BY message_id, device_id"
        )
        with self._session() as conn:
            rows = conn.execute(q, [bundle_id, *params, *([] if key_id is None else [key_id])]).fetchall()
        return _enrolment_set(rows)

    def delete_key_templates(self, key_id: str) -> int:
        with self._transaction() as conn:
            cur = conn.execute(f"DELETE FROM templates WHERE key_id = {self._sql.param}", (key_id,))
            return int(cur.rowcount)

    def enrolment_key_ids(self, bundle_id: str, kinds: Sequence[str]) -> dict[str, int]:
        of_kinds, params = self._sql.any_of("mechanism_kind", kinds)
        q = (
            f"SELECT key_id, COUNT(*) FROM templates WHERE bundle_id = {self._sql.param} AND purpose = 'enroll' "
            f"AND subject IS NOT NULL AND {of_kinds} GROUP BY key_id"
        )
        with self._session() as conn:
            return {str(k): int(n) for k, n in conn.execute(q, [bundle_id, *params])}

    def relabel(self, keys: Sequence[tuple[str, str]], subject: str) -> int:
        chunks = self._sql.chunks([(str(d), str(m)) for d, m in keys])
        n = 0
        # Where the keys are bound in chunks, the UPDATEs are made atomic by one transaction;
        # bound as arrays they are one statement, atomic by itself.
        with self._transaction() if self._sql.chunk else self._session() as conn:
            for chunk in chunks:
                if not chunk:
                    continue
                of_ids, params = self._sql.any_pair_of(("device_id", "message_id"), chunk)
                cur = conn.execute(
                    f"UPDATE templates SET subject = {self._sql.param}, purpose = 'enroll' WHERE {of_ids}",
                    [subject, *params],
                )
                n += cur.rowcount
        return n

    def delete_subject(self, subject: str) -> int:
        p = self._sql.param
        with self._session() as conn:
            q = f"DELETE FROM templates WHERE subject = {p} OR decided_subject = {p}"
            return int(conn.execute(q, (subject, subject)).rowcount)

    def names_subject(self, subject: str) -> bool:
        p = self._sql.param
        with self._session() as conn:
            for q, n in (
                (f"SELECT 1 FROM templates WHERE subject = {p} OR decided_subject = {p} LIMIT 1", 2),
                (f"SELECT 1 FROM recognition_events WHERE subject = {p} OR claimed_subject = {p} LIMIT 1", 2),
                # Opted in to Home Assistant, with nothing else left (retention, say): still theirs to erase.
                (f"SELECT 1 FROM home_assistant_people WHERE subject = {p}", 1),
            ):
                if conn.execute(q, (subject,) * n).fetchone() is not None:
                    return True
        return False

    def delete_subject_decisions(self, subject: str) -> int:
        p = self._sql.param
        with self._session() as conn:
            q = f"DELETE FROM recognition_events WHERE subject = {p} OR claimed_subject = {p}"
            return int(conn.execute(q, (subject, subject)).rowcount)

    def delete_received_before(self, cutoff: float, *, include_enrolment: bool = False) -> int:
        q = f"DELETE FROM templates WHERE received_at < {self._sql.param}" + (
            "" if include_enrolment else " AND purpose != 'enroll'"
        )
        with self._session() as conn:
            return int(conn.execute(q, (cutoff,)).rowcount)

    # ------------------------------------------------------------ ingest: decide, then forget

    def seen(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        with self._session() as conn:
            for chunk in self._sql.chunks(list(dict.fromkeys(keys))):
                if not chunk:
                    continue
                of_keys, params = self._sql.any_pair_of(("device_id", "message_id"), chunk)
                q = f"SELECT device_id, message_id FROM ingest_ledger WHERE {of_keys}"
                out.update((str(d), str(m)) for d, m in conn.execute(q, params))
        return out

    def commit_ingest(self, batch: IngestBatch) -> list[bool]:
        if not batch.ledger:
            return []
        first: dict[tuple[str, str], int] = {}
        for i, e in enumerate(batch.ledger):
            first.setdefault(e.key, i)
        unique = [batch.ledger[i] for i in first.values()]
        with self._transaction() as conn:
            new = self._insert_ledger(conn, unique)
            templates = [r for r in batch.templates if (r.device_id, r.message_id) in new]
            if templates:
                self._insert_template_rows(conn, templates)
            tracks = [t.row() for t in batch.tracks if t.key in new]
            if tracks:
                self._executemany(conn, _INSERT_TRACK.format(p=self._sql.param), tracks)
            decisions = [d.row() for d in batch.decisions if d.key in new]
            if decisions:  # last: the events lock is held from here to the commit only
                self._lock_events(conn)
                self._executemany(conn, _INSERT_DECISION.format(p=self._sql.param), decisions)
                self._notify(conn, EVENTS_CHANNEL, "")
        return [first[e.key] == i and e.key in new for i, e in enumerate(batch.ledger)]

    def count_received(self, *, device_id: str | None = None) -> int:
        q = "SELECT COUNT(*) FROM ingest_ledger"
        params: list[object] = []
        if device_id is not None:
            q += f" WHERE device_id = {self._sql.param}"
            params.append(device_id)
        with self._session() as conn:
            row = conn.execute(q, params).fetchone()
        return int(row[0]) if row else 0

    def add_decisions(self, records: Sequence[DecisionRecord]) -> None:
        if not records:
            return
        with self._transaction() as conn:
            self._lock_events(conn)
            self._executemany(conn, _INSERT_DECISION.format(p=self._sql.param), [d.row() for d in records])
            self._notify(conn, EVENTS_CHANNEL, "")

    def decisions(
        self, *, since_id: int = 0, limit: int = 1000, site: str = "", device_id: str = "", origin: str | None = None
    ) -> list[tuple[int, DecisionRecord]]:
        p = self._sql.param
        where = [f"id > {p}"]
        params: list[object] = [since_id]
        for column, value in (("site", site), ("device_id", device_id), ("origin", origin)):
            if value:
                where.append(f"{column} = {p}")
                params.append(value)
        q = (
            f"SELECT id, {', '.join(DECISION_COLUMNS)} FROM recognition_events WHERE {' AND '.join(where)} "
            f"ORDER BY id LIMIT {p}"
        )
        with self._session() as conn:
            rows = conn.execute(q, (*params, limit)).fetchall()
        out = []
        for r in rows:
            d = dict(zip(DECISION_COLUMNS, r[1:], strict=True))
            d["unknown"] = bool(d["unknown"])
            d["accepted"] = None if d["accepted"] is None else bool(d["accepted"])
            out.append((int(r[0]), DecisionRecord(**d)))
        return out

    def last_decision_id(self) -> int:
        with self._session() as conn:
            row = conn.execute("SELECT MAX(id) FROM recognition_events").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def first_decision_id(self) -> int:
        with self._session() as conn:
            row = conn.execute("SELECT MIN(id) FROM recognition_events").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def track_memory(self, tracks: Sequence[tuple[str, str]], *, now: float) -> list[TrackRelease]:
        rows: list[TrackRelease] = []
        p = self._sql.param
        with self._session() as conn:
            for chunk in self._sql.chunks(list(dict.fromkeys(tracks))):
                if not chunk:
                    continue
                pairs, params = self._sql.any_pair_of(("device_id", "track_id"), chunk)
                q = f"SELECT {', '.join(TRACK_COLUMNS)} FROM track_memory WHERE {pairs} AND expires_at > {p}"
                for r in conn.execute(q, [*params, now]):
                    rows.append(TrackRelease(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), float(r[5]),
                                             float(r[6]), int(r[7]), bytes(r[8])))  # fmt: skip
        return rows

    def expire_track_memory(self, now: float) -> int:
        with self._session() as conn:
            return int(conn.execute(f"DELETE FROM track_memory WHERE expires_at <= {self._sql.param}", (now,)).rowcount)

    def delete_ledger_before(self, cutoff: float) -> int:
        with self._session() as conn:
            q = f"DELETE FROM ingest_ledger WHERE received_at < {self._sql.param}"
            return int(conn.execute(q, (cutoff,)).rowcount)

    def delete_alerts_before(self, cutoff: float) -> int:
        with self._session() as conn:
            return int(conn.execute(f"DELETE FROM console_alerts WHERE at < {self._sql.param}", (cutoff,)).rowcount)

    def delete_decisions_before(self, cutoff: float) -> int:
        with self._session() as conn:
            q = f"DELETE FROM recognition_events WHERE at < {self._sql.param}"
            return int(conn.execute(q, (cutoff,)).rowcount)

    def delete_recognition_templates(
        self, *, before: float | None = None, unknown_only: bool = False
    ) -> dict[str, int]:
        p = self._sql.param
        where = "purpose IN ('identify', 'verify')"
        params: list[object] = []
        if before is not None:
            where += f" AND received_at < {p}"
            params.append(before)
        out = {"recognised": 0, "unknown": 0}
        with self._transaction() as conn:
            if not unknown_only:
                q = f"DELETE FROM templates WHERE {where} AND decided_subject IS NOT NULL"
                out["recognised"] = int(conn.execute(q, params).rowcount)
            q = f"DELETE FROM templates WHERE {where} AND decided_subject IS NULL"
            out["unknown"] = int(conn.execute(q, params).rowcount)
        return out

    # ------------------------------------------------------------ replica registrations

    def register_replica(self, replica_id: str, *, host: str, pid: int, token: str, now: float, stale_s: float,
                         alive: Callable[[int], bool]) -> ReplicaHolder | None:  # fmt: skip
        """Register this process as ``replica_id``: None when it now holds it, else the live holder.

        A registration is taken over when its heartbeat is older than ``stale_s``, or when it is this host's and
        ``alive(pid)`` says its process is gone (a replica restarted after a crash). Race-free on both databases:
        an insert that finds the id taken, or an update of a holder that changed meanwhile, starts again.
        """
        p = self._sql.param
        cols = "host, pid, token, started_at, heartbeat_at"
        for _ in range(5):
            with self._transaction() as conn:
                row = conn.execute(
                    f"SELECT {cols} FROM replica_registrations WHERE replica_id = {p}", (replica_id,)
                ).fetchone()
                if row is None:
                    n = conn.execute(
                        f"INSERT INTO replica_registrations (replica_id, {cols}) VALUES ({p}, {p}, {p}, {p}, {p}, {p}) "
                        "ON CONFLICT (replica_id) DO NOTHING",
                        (replica_id, host, pid, token, now, now),
                    ).rowcount
                    if n == 1:
                        return None
                    continue
                holder = ReplicaHolder(str(row[0]), int(row[1]), str(row[2]), float(row[3]), float(row[4]))
                gone = holder.host == host and not alive(holder.pid)
                if now - holder.heartbeat_at < stale_s and not gone:
                    return holder
                n = conn.execute(
                    f"UPDATE replica_registrations SET host = {p}, pid = {p}, token = {p}, started_at = {p}, "
                    f"heartbeat_at = {p} WHERE replica_id = {p} AND token = {p}",
                    (host, pid, token, now, now, replica_id, holder.token),
                ).rowcount
                if n == 1:
                    return None
        raise StoreError(f"cluster.replica_id: could not register {replica_id!r} (the registration kept changing)")

    def heartbeat_replica(self, replica_id: str, token: str, now: float) -> bool:
        """Renew this process's registration; False when another process holds ``replica_id`` now."""
        p = self._sql.param
        with self._session() as conn:
            cur = conn.execute(
                f"UPDATE replica_registrations SET heartbeat_at = {p} WHERE replica_id = {p} AND token = {p}",
                (now, replica_id, token),
            )
            return int(cur.rowcount) == 1

    def release_replica(self, replica_id: str, token: str) -> None:
        """Give ``replica_id`` up (a clean stop): the next replica under it starts at once."""
        p = self._sql.param
        with self._session() as conn:
            conn.execute(
                f"DELETE FROM replica_registrations WHERE replica_id = {p} AND token = {p}", (replica_id, token)
            )

    def kept_counts(self, background_prefix: str) -> KeptCounts:
        q_enrol = "SELECT subject, COUNT(*) FROM templates WHERE purpose = 'enroll' GROUP BY subject"
        q_decided = (
            "SELECT SUM(CASE WHEN decided_subject IS NOT NULL THEN 1 ELSE 0 END), "
            "SUM(CASE WHEN decided_subject IS NULL THEN 1 ELSE 0 END) FROM templates WHERE purpose != 'enroll'"
        )
        enrolment = background = 0
        with self._session() as conn:
            for subject, n in conn.execute(q_enrol):
                if background_prefix and str(subject or "").startswith(background_prefix):
                    background += int(n)
                else:
                    enrolment += int(n)
            recognised, unknown = conn.execute(q_decided).fetchone()
            (decisions,) = conn.execute("SELECT COUNT(*) FROM recognition_events").fetchone()
            (unknown_decisions,) = conn.execute("SELECT COUNT(*) FROM recognition_events WHERE unknown = 1").fetchone()
            (ledger,) = conn.execute("SELECT COUNT(*) FROM ingest_ledger").fetchone()
            (tracks,) = conn.execute("SELECT COUNT(*) FROM track_memory").fetchone()
        return KeptCounts(
            enrolment=enrolment,
            background=background,
            recognised=int(recognised or 0),
            unknown=int(unknown or 0),
            decisions=int(decisions),
            unknown_decisions=int(unknown_decisions),
            ledger=int(ledger),
            track_memory=int(tracks),
        )

    # ------------------------------------------------------------ bundles, erasures

    def put_bundle(self, bundle_id: str, payload: bytes, published_at: float) -> None:
        p = self._sql.param
        with self._session() as conn:
            conn.execute(
                f"INSERT INTO bundles (bundle_id, published_at, payload) VALUES ({p}, {p}, {p}) "
                "ON CONFLICT (bundle_id) DO UPDATE SET published_at = excluded.published_at",
                (bundle_id, published_at, payload),
            )

    def get_bundle(self, bundle_id: str | None = None) -> bytes | None:
        with self._session() as conn:
            if bundle_id is None:
                row = conn.execute("SELECT payload FROM bundles ORDER BY published_at DESC LIMIT 1").fetchone()
            else:
                q = f"SELECT payload FROM bundles WHERE bundle_id = {self._sql.param}"
                row = conn.execute(q, (bundle_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def put_device_report(self, device_id: str, site: str, report: bytes, received_at: float) -> None:
        p = self._sql.param
        with self._session() as conn:
            conn.execute(
                f"INSERT INTO device_reports (device_id, site, report, received_at) VALUES ({p}, {p}, {p}, {p}) "
                "ON CONFLICT (device_id) DO UPDATE SET site = excluded.site, report = excluded.report, "
                "received_at = excluded.received_at",
                (device_id, site, report, received_at),
            )

    def device_reports(self) -> dict[str, tuple[str, bytes, float]]:
        with self._session() as conn:
            rows = conn.execute("SELECT device_id, site, report, received_at FROM device_reports").fetchall()
        return {str(r[0]): (str(r[1]), bytes(r[2]), float(r[3])) for r in rows}

    def record_erasure(self, subject: str, at: float) -> None:
        p = self._sql.param
        with self._transaction() as conn:
            conn.execute(
                f"INSERT INTO erasures (subject, erased_at) VALUES ({p}, {p}) "
                "ON CONFLICT (subject) DO UPDATE SET erased_at = excluded.erased_at",
                (subject, at),
            )
            # The other replicas re-read the erasure list when this commits (the payload names no one).
            self._notify(conn, ERASURES_CHANNEL, "")

    # ------------------------------------------------------------ model registry (shared by replicas)

    def promote_model(
        self,
        *,
        meta: Mapping[str, Any],
        onnx: bytes,
        scores: bytes | None,
        keep: int,
        now: float | None = None,
    ) -> str:
        """Store a model version and make it the serving one, in one transaction; returns its name.

        The version number is the highest stored plus one (numbers are never reused while a
        version is kept); ``meta`` gets ``version`` and ``created_at``; versions beyond the newest
        ``keep`` are deleted in the same transaction; the other replicas are notified on commit.
        """
        import hashlib
        import json

        p = self._sql.param
        at = time.time() if now is None else now
        with self._transaction() as conn:
            self._lock_models(conn)
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM model_versions").fetchone()
            number = int(row[0]) + 1
            name = f"v{number:06d}"
            full = dict(meta)
            full["version"] = name
            full.setdefault("created_at", at)
            conn.execute(
                "INSERT INTO model_versions (version, name, created_at, bundle_id, unknown_threshold, "
                "verify_threshold, target_far, meta, onnx, onnx_sha256, scores) "
                f"VALUES ({', '.join([p] * 11)})",
                (
                    number,
                    name,
                    float(full["created_at"]),
                    str(full.get("bundle_id", "")),
                    float(full.get("unknown_threshold", 0.0)),
                    float(full.get("verify_threshold", 0.0)),
                    float(full.get("target_far", 0.0)),
                    json.dumps(full, sort_keys=True),
                    onnx,
                    hashlib.sha256(onnx).hexdigest(),
                    scores,
                ),
            )
            conn.execute(
                f"INSERT INTO model_current (slot, version, promoted_at) VALUES (1, {p}, {p}) "
                "ON CONFLICT (slot) DO UPDATE SET version = excluded.version, promoted_at = excluded.promoted_at",
                (number, at),
            )
            conn.execute(f"DELETE FROM model_versions WHERE version <= {p} AND version != {p}", (number - keep, number))
            self._notify(conn, MODELS_CHANNEL, name)
        return name

    def set_current_model(self, name: str, *, now: float | None = None) -> None:
        """Make the stored version ``name`` the serving one (a roll-back or roll-forward); replicas are notified.

        Raises
        ------
        KeyError
            No stored version ``name``.
        """
        p = self._sql.param
        at = time.time() if now is None else now
        with self._transaction() as conn:
            self._lock_models(conn)
            row = conn.execute(f"SELECT version FROM model_versions WHERE name = {p}", (name,)).fetchone()
            if row is None:
                raise KeyError(name)
            conn.execute(
                f"INSERT INTO model_current (slot, version, promoted_at) VALUES (1, {p}, {p}) "
                "ON CONFLICT (slot) DO UPDATE SET version = excluded.version, promoted_at = excluded.promoted_at",
                (int(row[0]), at),
            )
            self._notify(conn, MODELS_CHANNEL, name)

    def current_model_stamp(self) -> tuple[int, float] | None:
        """(version number, promoted_at) of the serving version: a cheap change detector."""
        with self._session() as conn:
            row = conn.execute("SELECT version, promoted_at FROM model_current WHERE slot = 1").fetchone()
        return None if row is None else (int(row[0]), float(row[1]))

    def get_model(self, name: str | None = None) -> tuple[str, str, bytes, bytes | None, str] | None:
        """(name, meta JSON, ONNX, scores npz, ONNX sha256) of version ``name``, or of the serving one."""
        q = "SELECT v.name, v.meta, v.onnx, v.scores, v.onnx_sha256 FROM model_versions v "
        with self._session() as conn:
            if name is None:
                row = conn.execute(q + "JOIN model_current c ON c.version = v.version WHERE c.slot = 1").fetchone()
            else:
                row = conn.execute(q + f"WHERE v.name = {self._sql.param}", (name,)).fetchone()
        if row is None:
            return None
        return str(row[0]), str(row[1]), bytes(row[2]), None if row[3] is None else bytes(row[3]), str(row[4])

    def model_names(self) -> list[tuple[str, str]]:
        """(name, meta JSON) of every stored version, oldest first."""
        with self._session() as conn:
            return [(str(n), str(m)) for n, m in conn.execute("SELECT name, meta FROM model_versions ORDER BY version")]

    def delete_models(self, names: Sequence[str], *, unless_current: bool = True) -> list[str]:
        """Delete the versions ``names`` (never the serving one); returns those deleted."""
        if not names:
            return []
        of_names, params = self._sql.any_of("name", list(names))
        q = f"DELETE FROM model_versions WHERE {of_names}"
        if unless_current:
            q += " AND version NOT IN (SELECT version FROM model_current)"
        with self._transaction() as conn:
            self._lock_models(conn)
            deleted = [str(r[0]) for r in conn.execute(q + " RETURNING name", params)]
            if deleted:
                self._notify(conn, MODELS_CHANNEL, "")
        return sorted(deleted)

    def erasures(self) -> Mapping[str, float]:
        with self._session() as conn:
            return {s: float(t) for s, t in conn.execute("SELECT subject, erased_at FROM erasures")}

    # ------------------------------------------------------------ who is shown in Home Assistant (opted in)

    def set_home_assistant_person(self, subject: str, display_name: str, at: float) -> bool:
        """Opt ``subject`` in under ``display_name`` (checked), or change the name; True when it was not in before."""
        name = check_display_name(display_name, "display_name")
        p = self._sql.param
        with self._transaction() as conn:
            was = conn.execute(f"SELECT 1 FROM home_assistant_people WHERE subject = {p}", (subject,)).fetchone()
            conn.execute(
                f"INSERT INTO home_assistant_people (subject, display_name, opted_in_at) VALUES ({p}, {p}, {p}) "
                "ON CONFLICT (subject) DO UPDATE SET display_name = excluded.display_name, "
                "opted_in_at = excluded.opted_in_at",
                (subject, name, at),
            )
        return was is None

    def clear_home_assistant_person(self, subject: str) -> bool:
        """Opt ``subject`` out (an opt-out, or an erasure); True when they were in."""
        with self._session() as conn:
            q = f"DELETE FROM home_assistant_people WHERE subject = {self._sql.param}"
            return int(conn.execute(q, (subject,)).rowcount) > 0

    def home_assistant_people(self) -> dict[str, ShownPerson]:
        """``{subject: ShownPerson}`` of every subject who opted in."""
        with self._session() as conn:
            rows = conn.execute("SELECT subject, display_name, opted_in_at FROM home_assistant_people").fetchall()
        return {str(r[0]): ShownPerson(str(r[0]), str(r[1]), float(r[2])) for r in rows}


_INSERT_DECISION = (
    f"INSERT INTO recognition_events ({', '.join(DECISION_COLUMNS)}) "
    f"VALUES ({', '.join(['{p}'] * len(DECISION_COLUMNS))}) ON CONFLICT DO NOTHING"
)
_INSERT_TRACK = (
    f"INSERT INTO track_memory ({', '.join(TRACK_COLUMNS)}) "
    f"VALUES ({', '.join(['{p}'] * len(TRACK_COLUMNS))}) ON CONFLICT DO NOTHING"
)


def _enrolment_set(rows: Sequence[Sequence[Any]]) -> EnrolmentSet:
    if not rows:
        return EnrolmentSet(
            values=np.zeros((0, 0), dtype=np.float32),
            subjects=np.array([], dtype=object),
            kinds=np.array([], dtype=object),
            message_ids=[],
        )
    widths = {int(r[3]) for r in rows}
    if len(widths) != 1:
        raise StoreError(f"templates: enrolment templates of one bundle have several dimensions {sorted(widths)}")
    values = stack_blobs([bytes(r[4]) for r in rows], widths.pop())
    return EnrolmentSet(
        values=values,
        subjects=np.array([r[1] for r in rows], dtype=object),
        kinds=np.array([r[2] for r in rows], dtype=object),
        message_ids=[str(r[0]) for r in rows],
    )
