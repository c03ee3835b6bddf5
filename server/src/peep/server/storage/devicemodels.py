"""The ``device_models`` table (migration 14): every signed device model issued, by serial.

Written once for SQLite and PostgreSQL on the store's own primitives (``_session``, ``_transaction``, the
models lock and its :class:`~peep.server.storage.dialect.Dialect`), like :mod:`peep.server.console.store`,
so replicas on one PostgreSQL issue one sequence of serials and serve the same newest model.

A serial is allocated under the models lock (the one promotions take) in the transaction that inserts its
row, so serials increase strictly across processes and replicas; the row with the largest serial is never
deleted, so a serial is never reused. Only the newest model of a bundle and site key keeps its files (the
``payload``): a device takes nothing older, and a model a few megabytes large is not kept once a day for
ever. The rows themselves (ids, times, counts; no face, no name) let ingest check a decision's serial for as
long as a device may spool one (:meth:`DeviceModelStore.delete_expired_before`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from peep.server.storage.sql import SqlStore

_COLUMNS = (
    "serial, model_version, bundle_id, key_id, trained_at, issued_at, expires_at, subjects, erased, calibration, "
    "reason, withdrawn_at"
)


@dataclass(frozen=True)
class IssuedModel:
    """One issued device model (a row of ``device_models``; ``payload`` only when it was asked for and kept).

    Attributes
    ----------
    serial : int
    model_version, bundle_id, key_id : str
        The server model it was made from, its bundle and its site key's public id ("" for none).
    trained_at, issued_at, expires_at : float
        Unix times.
    subjects, erased : int
        Enrolled subjects of the model, and how many of them were erased since it was trained.
    calibration : str
        The calibration set it carries (its SHA-256's first 16 hex digits, and how many faces).
    reason : str
        Why it was issued: ``promotion``, ``reissue``, ``erasure`` or ``start``.
    withdrawn_at : float or None
        When its site key was retired (never served again, decisions made with it refused).
    payload : bytes or None
        The encoded ``DeviceModelFiles``.
    """

    serial: int
    model_version: str
    bundle_id: str
    key_id: str
    trained_at: float
    issued_at: float
    expires_at: float
    subjects: int
    erased: int
    calibration: str
    reason: str
    withdrawn_at: float | None = None
    payload: bytes | None = None

    @property
    def withdrawn(self) -> bool:
        return self.withdrawn_at is not None

    def row(self) -> tuple[object, ...]:
        return (
            self.serial, self.model_version, self.bundle_id, self.key_id, self.trained_at, self.issued_at,
            self.expires_at, self.subjects, self.erased, self.calibration, self.reason, self.withdrawn_at,
            self.payload,
        )  # fmt: skip


def _model(r: Any, payload: bytes | None = None) -> IssuedModel:
    return IssuedModel(
        serial=int(r[0]), model_version=str(r[1]), bundle_id=str(r[2]), key_id=str(r[3]), trained_at=float(r[4]),
        issued_at=float(r[5]), expires_at=float(r[6]), subjects=int(r[7]), erased=int(r[8]), calibration=str(r[9]),
        reason=str(r[10]), withdrawn_at=None if r[11] is None else float(r[11]), payload=payload,
    )  # fmt: skip


class DeviceModelStore:
    """Reads and writes of ``device_models`` on a :class:`~peep.server.storage.sql.SqlStore`."""

    def __init__(self, store: Any) -> None:
        if not isinstance(store, SqlStore):
            raise TypeError(f"store: expected a SQL store (SQLite or PostgreSQL), received {type(store).__name__}")
        self.store = store
        self._p = store._sql.param

    def issue(
        self,
        build: Callable[[int], IssuedModel],
        *,
        due: Callable[[IssuedModel | None], bool] | None = None,
        bundle_id: str,
        key_id: str,
    ) -> IssuedModel | None:
        """Allocate the next serial, build the model with it and keep it, in one transaction.

        Parameters
        ----------
        build : callable
            ``build(serial) -> IssuedModel`` with its ``payload`` (the signed files name the serial, so they are
            made once it is allocated; the signature takes milliseconds, so the lock is held that long).
        due : callable, optional
            ``due(newest of bundle_id and key_id, or None) -> bool``: issue only when it says so, decided under
            the lock (two replicas re-issuing at once issue one model).
        bundle_id, key_id : str
            The scope whose older models give up their files.

        Returns
        -------
        IssuedModel or None
            The model kept; None when ``due`` said no.
        """
        p = self._p
        with self.store._transaction() as conn:
            self.store._lock_models(conn)
            if due is not None and not due(self._newest(conn, bundle_id, key_id)):
                return None
            (top,) = conn.execute("SELECT COALESCE(MAX(serial), 0) FROM device_models").fetchone()
            model = build(int(top) + 1)
            if model.serial != int(top) + 1 or (model.bundle_id, model.key_id) != (bundle_id, key_id):
                raise ValueError(f"build: expected serial {int(top) + 1} of {bundle_id}/{key_id or 'none'}")
            conn.execute(f"INSERT INTO device_models ({_COLUMNS}, payload) VALUES ({', '.join([p] * 13)})", model.row())
            conn.execute(
                f"UPDATE device_models SET payload = NULL WHERE bundle_id = {p} AND key_id = {p} AND serial < {p}",
                (bundle_id, key_id, model.serial),
            )
        return model

    def _newest(self, conn: Any, bundle_id: str, key_id: str) -> IssuedModel | None:
        p = self._p
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM device_models WHERE bundle_id = {p} AND key_id = {p} ORDER BY serial DESC LIMIT 1",
            (bundle_id, key_id),
        ).fetchone()
        return None if row is None else _model(row)

    def newest(self, bundle_id: str, key_id: str) -> IssuedModel | None:
        """The newest model of ``bundle_id`` and ``key_id`` (withdrawn or not), without its files."""
        with self.store._session() as conn:
            return self._newest(conn, bundle_id, key_id)

    def payload(self, serial: int) -> bytes | None:
        """The files of model ``serial`` while it is the newest of its scope and not withdrawn; else None."""
        with self.store._session() as conn:
            row = conn.execute(
                f"SELECT payload FROM device_models WHERE serial = {self._p} AND withdrawn_at IS NULL", (serial,)
            ).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def get(self, serial: int) -> IssuedModel | None:
        """Model ``serial`` without its files, or None when no such serial is kept."""
        with self.store._session() as conn:
            row = conn.execute(f"SELECT {_COLUMNS} FROM device_models WHERE serial = {self._p}", (serial,)).fetchone()
        return None if row is None else _model(row)

    def recent(self, limit: int = 20) -> list[IssuedModel]:
        """The newest ``limit`` models issued, newest first (the console's Models page)."""
        with self.store._session() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM device_models ORDER BY serial DESC LIMIT {self._p}", (limit,)
            ).fetchall()
        return [_model(r) for r in rows]

    def enrolled_subjects(self, bundle_id: str, key_id: str) -> list[str]:
        """Every subject with enrolment templates of ``bundle_id`` under ``key_id`` (what training fits on),
        the administrator's background people (``background:<tag>``) included: none may calibrate a model."""
        p = self._p
        q = (
            f"SELECT DISTINCT subject FROM templates WHERE bundle_id = {p} AND purpose = 'enroll' "
            f"AND subject IS NOT NULL AND key_id = {p}"
        )
        with self.store._session() as conn:
            return sorted(str(r[0]) for r in conn.execute(q, (bundle_id, key_id)))

    def withdraw_key(self, key_id: str, at: float) -> int:
        """Withdraw every model of site key ``key_id``: never served again, its files dropped; returns how many."""
        p = self._p
        with self.store._transaction() as conn:
            self.store._lock_models(conn)
            cur = conn.execute(
                f"UPDATE device_models SET withdrawn_at = {p}, payload = NULL "
                f"WHERE key_id = {p} AND withdrawn_at IS NULL",
                (at, key_id),
            )
            return int(cur.rowcount)

    def delete_expired_before(self, cutoff: float) -> int:
        """Forget models that expired before ``cutoff`` (never the largest serial); returns how many."""
        p = self._p
        with self.store._session() as conn:
            cur = conn.execute(
                f"DELETE FROM device_models WHERE expires_at < {p} "
                "AND serial < (SELECT MAX(serial) FROM device_models)",
                (cutoff,),
            )
            return int(cur.rowcount)
