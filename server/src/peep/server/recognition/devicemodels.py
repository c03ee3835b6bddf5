"""Signed device models: the serving recogniser, issued to devices that decide on their own clean projection.

The server trains only on locally private releases, so a trained model is post-processing of them and may go
to the device, the one party PEEP trusts (it sees the face anyway). :class:`DeviceModels` makes the signed
files of :mod:`peep.core.devicemodel` from the serving version -- its ONNX recogniser, its classes as opaque
ids under the version's ``device_class_salt``, the erased subjects' ids, the FPIR/FAR targets and the
configured calibration set (:mod:`peep.server.bundles.calibrate`) -- and keeps each one, by serial, in the
database (:mod:`peep.server.storage.devicemodels`).

When a model is issued
    On every promotion (the trainer, ``peep train``, the Train call: :meth:`DeviceModels.issue`), at once
    when a subject is erased (a new serial of the same version naming the subject among its ``erased``: a
    device stops naming them without waiting for a retrained model), and whenever the newest one is older
    than ``training.device_models.reissue_s`` (:meth:`DeviceModels.poll`, the server's loop), so that a
    device in touch never holds an expired model. Retiring a site key withdraws its models
    (:meth:`DeviceModels.withdraw_key`): none is served or re-issued for it, and the devices' copies expire.
What is refused
    A version trained before device models existed (no ``device_class_salt``), a calibration set of another
    bundle, dimension or domain, and one holding a person the version was trained on (a background subject
    ``background:<tag>`` or an enrolled one): each is logged once and shown by :meth:`DeviceModels.status`;
    the model keeps serving the server's own decisions.
Mapping a released label back
    :meth:`DeviceModels.label_map` gives, for a version, each opaque class id's subject: a device's decision
    names an id, the server records the subject (or unknown, for a subject erased since).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from peep.core.devicemodel import build_device_model_files, class_id, class_key_file
from peep.core.wire import ID_PATTERN, device_model_message
from peep.server.bundles.calibrate import CalibrationSet
from peep.server.config import DeviceModelsConfig
from peep.server.recognition.model_registry import AnyRegistry, RegistryError
from peep.server.storage.devicemodels import DeviceModelStore, IssuedModel
from peep.v1 import recognition_pb2

__all__ = ["DeviceModels", "NoDeviceModel", "check_model_request"]

log = logging.getLogger(__name__)

#: Versions whose label maps are kept in memory (a decision names one of the few recent ones).
_LABEL_MAPS = 16
#: Seconds a looked-up serial is trusted before it is read again (a withdrawal by another replica takes effect).
_SERIAL_TTL_S = 10.0


class DeviceModelRefused(ValueError):
    """The serving version cannot become a device model (the message names what and why)."""


class NoDeviceModel(LookupError):
    """No device model is served for a bundle and site key: none issued, or withdrawn (gRPC ``NOT_FOUND``)."""


_KEY_ID = re.compile(r"^sk-[0-9a-f]{16}$")


def check_model_request(bundle_id: str, key_id: str) -> None:
    """Bound what a device asks a model for; :class:`ValueError` naming the field, the expectation, the value."""
    if key_id and not _KEY_ID.match(key_id):
        raise ValueError(f"key_id: expected '' or a site key id ('sk-' and 16 hex digits), received {key_id[:64]!r}")
    if not ID_PATTERN.match(bundle_id):
        raise ValueError(
            f"bundle_id: expected the id of the device's bundle (1-128 characters [A-Za-z0-9_.:@-]), "
            f"received {bundle_id[:64]!r}"
        )


@dataclass(frozen=True)
class LabelMap:
    """A version's opaque class ids (of every device model made from it) and the subjects they stand for.

    Attributes
    ----------
    version : str
    subjects : dict of str to str
        Opaque class id -> subject, for every enrolled class (the background class has no id).
    trained_at : float
    """

    version: str
    subjects: dict[str, str]
    trained_at: float


class DeviceModels:
    """Issue, keep and look up the signed device models (see the module docstring).

    Parameters
    ----------
    config : DeviceModelsConfig
    material : (Ed25519PrivateKey, CalibrationSet) or None
        What :func:`peep.server.startup.device_model_material` read; None: no device model is issued.
    store : SqlStore
    registry : ModelRegistry or DatabaseModelRegistry
    recogniser : Recogniser
        The serving model and the erasure list.
    background_prefix : str
        ``training.background_prefix``.
    announce_others : bool
        Whether :meth:`poll` announces (broadcasts) a newer model another process issued (``peep train`` beside a
        single server); replicas leave it to the one that issued it, so a device hears each serial once.
    clock : callable
        Unix time (tests).
    """

    def __init__(
        self,
        config: DeviceModelsConfig,
        material: tuple[Any, CalibrationSet] | None,
        store: Any,
        registry: AnyRegistry,
        recogniser: Any,
        *,
        background_prefix: str = "background:",
        announce_others: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.registry = registry
        self.recogniser = recogniser
        self.background_prefix = background_prefix
        self.announce_others = announce_others
        self.clock = clock
        self.rows: DeviceModelStore | None
        try:
            self.rows = DeviceModelStore(store)
        except TypeError:
            self.rows = None
        self._key: Any = material[0] if material is not None else None
        self.calibration: CalibrationSet | None = material[1] if material is not None else None
        #: Why no device model is issued ("" when they are).
        self.disabled_reason = ""
        if self.rows is None:
            self.disabled_reason = "the store keeps no device models (not a SQL store)"
        elif config.signing_key is None:
            self.disabled_reason = "training.device_models.signing_key is not set"
        elif config.calibration is None:
            self.disabled_reason = "training.device_models.calibration is not set"
        elif material is None:
            self.disabled_reason = "training.device_models: the signing key or the calibration set was not read"
        #: Why the last issue was refused (None: it was not).
        self.last_error: str | None = None
        self._refused: set[str] = set()  # errors logged already (each once)
        self._listeners: list[Callable[[IssuedModel], None]] = []
        self._lock = threading.Lock()
        self._onnx: tuple[str, bytes] | None = None
        self._payload: tuple[int, bytes] | None = None
        self._serials: OrderedDict[int, tuple[float, IssuedModel | None]] = OrderedDict()
        self._maps: OrderedDict[str, LabelMap | None] = OrderedDict()
        #: The newest serial this process announced to its listeners, per (bundle_id, key_id).
        self._announced: dict[tuple[str, str], int] = {}

    @property
    def enabled(self) -> bool:
        return not self.disabled_reason

    def add_listener(self, fn: Callable[[IssuedModel], None]) -> None:
        """Call ``fn(model)`` (with its payload) for every model this process issues or first sees (MQTT)."""
        self._listeners.append(fn)

    # ------------------------------------------------------------ issuing

    def issue(self, reason: str = "promotion") -> IssuedModel | None:
        """Issue a new serial of the serving model now; None when disabled, no model serves, or it was refused."""
        return self._issue(reason, None)

    def poll(self, now: float | None = None, *, reason: str = "reissue") -> IssuedModel | None:
        """Issue when the newest model of the serving one is missing, stale or out of date; announce a newer one.

        Out of date: made from another version, with another count of erased subjects, another calibration
        set, or withdrawn; stale: issued ``reissue_s`` ago or more. Decided under the models lock, so replicas
        polling together issue one model. A model some other process issued (``peep train``) and this one has
        not announced is announced here, unless ``announce_others`` is off (replicas).
        """
        at = self.clock() if now is None else now
        m = self.recogniser.model
        if m is None or self.registry.current_name() != m.version:
            # Not serving the registry's current version yet (another process promoted or rolled back a moment
            # ago): re-issuing the one served here would give devices a newer serial of an older choice.
            return None
        model = self._issue(reason, at)
        if model is None and self.rows is not None and self.enabled and self.announce_others:
            newest = self.rows.newest(m.bundle_id, m.key_id)
            scope = (m.bundle_id, m.key_id)
            if newest is not None and not newest.withdrawn and newest.serial > self._announced.get(scope, 0):
                full = self.newest(m.bundle_id, m.key_id)
                if full is not None:
                    self._announce(full)
        return model

    def _issue(self, reason: str, due_at: float | None) -> IssuedModel | None:
        if not self.enabled or self.rows is None or self.calibration is None:
            return None
        m = self.recogniser.model
        if m is None:
            return None
        with self._lock:
            try:
                plan = self._plan(m)
            except DeviceModelRefused as exc:
                self._refuse(str(exc))
                return None
            cal_tag = f"{self.calibration.sha256[:16]} ({self.calibration.n_faces} faces)"
            erased = plan["erased"]

            def due(newest: IssuedModel | None) -> bool:
                if due_at is None:
                    return True
                return (
                    newest is None
                    or newest.withdrawn
                    or newest.model_version != m.version
                    or newest.erased != len(erased)
                    or newest.calibration != cal_tag
                    or due_at - newest.issued_at >= self.config.reissue_s
                )

            issued_at = self.clock() if due_at is None else due_at
            cal = self.calibration

            def build(serial: int) -> IssuedModel:
                files = build_device_model_files(
                    onnx=plan["onnx"],
                    calibration=cal.projections,
                    subjects=plan["classes"],
                    background_index=plan["background_index"],
                    serial=serial,
                    model_version=m.version,
                    bundle_id=m.bundle_id,
                    key_id=m.key_id,
                    n_components=m.n_components,
                    trained_at=m.trained_at,
                    signing_key=self._key,
                    fpir=self.config.fpir,
                    far=self.config.far,
                    erased=erased,
                    class_key=plan["salt"],
                    extra={"domain": m.domain, "calibration_sha256": cal.sha256},
                    issued_at=issued_at,
                    valid_s=self.config.valid_s,
                    # Each face's person (an index, never the tag): a device weighs every public person the same.
                    calibration_groups=cal.groups,
                )
                payload = device_model_message(files, serial).SerializeToString(deterministic=True)
                return IssuedModel(
                    serial=serial, model_version=m.version, bundle_id=m.bundle_id, key_id=m.key_id,
                    trained_at=m.trained_at, issued_at=issued_at, expires_at=issued_at + self.config.valid_s,
                    subjects=plan["subjects"], erased=len(erased), calibration=cal_tag, reason=reason, payload=payload,
                )  # fmt: skip

            model = self.rows.issue(build, due=due, bundle_id=m.bundle_id, key_id=m.key_id)
            if model is None:
                return None
            self.last_error = None
            assert model.payload is not None
            self._payload = (model.serial, model.payload)
        log.info(
            "device model issued",
            extra={"serial": model.serial, "version": model.model_version, "bundle_id": model.bundle_id,
                   "key_id": model.key_id, "reason": reason, "erased": model.erased,
                   "expires_at": round(model.expires_at, 1), "bytes": len(model.payload)},
        )  # fmt: skip
        self._announce(model)
        return model

    def _announce(self, model: IssuedModel) -> None:
        scope = (model.bundle_id, model.key_id)
        if model.serial <= self._announced.get(scope, 0):
            return
        self._announced[scope] = model.serial
        for fn in self._listeners:
            try:
                fn(model)
            except Exception:  # a broker away must not stop issuing
                log.exception("device model listener failed")

    def _refuse(self, message: str) -> None:
        self.last_error = message
        if message not in self._refused:
            self._refused.add(message)
            log.error("device model not issued", extra={"error": message})

    def _plan(self, m: Any) -> dict[str, Any]:
        """What the device model of serving model ``m`` is made of; :class:`DeviceModelRefused` when it cannot be."""
        cal = self.calibration
        assert cal is not None
        meta = m.meta
        salt_hex = meta.get("device_class_salt")
        try:
            salt = bytes.fromhex(str(salt_hex))
        except ValueError:
            salt = b""
        if len(salt) < 16:
            raise DeviceModelRefused(
                f"model_version: {m.version} was trained before device models (no device_class_salt in its "
                "metadata); train again to issue device models"
            )
        if cal.bundle_id != m.bundle_id:
            raise DeviceModelRefused(
                f"training.device_models.calibration: expected projections of bundle {m.bundle_id} (the serving "
                f"model {m.version}'s), received a set of bundle {cal.bundle_id}: run peep bundle calibrate with it"
            )
        if cal.n_components != m.n_components or (m.domain and cal.domain != m.domain):
            raise DeviceModelRefused(
                f"training.device_models.calibration: expected {m.n_components} coordinates of the {m.domain!r} "
                f"domain (model {m.version}), received {cal.n_components} of {cal.domain!r}: run peep bundle "
                f"calibrate with --mechanism {', '.join(meta.get('mechanism_kinds', [])) or '?'}"
            )
        classes = [str(c) for c in meta["classes"]]
        # The background class is one column: its people are named only by their enrolment templates.
        assert self.rows is not None
        trained = {*classes, *self.rows.enrolled_subjects(m.bundle_id, m.key_id)}
        overlap = cal.overlap(trained, self.background_prefix)
        if overlap:
            more = f" and {len(overlap) - 10} more" if len(overlap) > 10 else ""
            shown = ", ".join(repr(t) for t in overlap[:10]) + more
            raise DeviceModelRefused(
                f"training.device_models.calibration: expected public faces of people model {m.version} was never "
                f"trained on, received {len(overlap)} it was trained on (enrolled, or background "
                f"{self.background_prefix}<tag>): {shown}; run peep bundle calibrate again with --exclude naming them"
            )
        bg = meta.get("background_index")
        trained_at = float(m.trained_at)
        erased = sorted(
            c for i, c in enumerate(classes)
            if i != bg and (at := self.recogniser.erased_at(c)) is not None and at >= trained_at
        )  # fmt: skip
        if self._onnx is None or self._onnx[0] != m.version:
            try:
                self._onnx = (m.version, self.registry.get(m.version).onnx_bytes())
            except (RegistryError, OSError) as exc:
                raise DeviceModelRefused(f"model_version: {m.version} is unreadable ({exc})") from None
        return {
            "onnx": self._onnx[1],
            "classes": classes,
            "background_index": bg,
            "salt": salt,
            "erased": erased,
            "subjects": len(classes) - (1 if bg is not None else 0),
        }

    # ------------------------------------------------------------ serving

    def newest(self, bundle_id: str, key_id: str) -> IssuedModel | None:
        """The newest model of ``bundle_id`` and ``key_id`` with its files; None when none, or it was withdrawn."""
        if self.rows is None:
            return None
        row = self.rows.newest(bundle_id, key_id)
        if row is None or row.withdrawn:
            return None
        cached = self._payload
        if cached is not None and cached[0] == row.serial:
            payload: bytes | None = cached[1]
        else:
            payload = self.rows.payload(row.serial)
            if payload is None:
                return None  # withdrawn (or superseded) meanwhile
            self._payload = (row.serial, payload)
        return replace(row, payload=payload)

    def answer(self, bundle_id: str, key_id: str, have_serial: int, *, with_class_key: bool = False) -> bytes:
        """The encoded ``DeviceModelFiles`` a device asking with ``have_serial`` gets (checked inputs).

        The newest model of its bundle and key with its files, or ``unchanged`` (its serial, no files) when the
        device holds it already (``have_serial`` at least the newest serial). ``with_class_key``: the files
        also hold ``class.key``, the version's class key a door turns a badge's subject into a column with;
        only for a caller the server authenticated, never on the broker.

        Raises
        ------
        NoDeviceModel
            None was issued for that bundle and key, or its key was retired; the message names both.
        """
        newest = self.rows.newest(bundle_id, key_id) if self.rows is not None else None
        if newest is None or newest.withdrawn:
            why = (
                "its site key was retired"
                if newest is not None
                else ("none was issued" if self.enabled else f"none is issued: {self.disabled_reason}")
            )
            raise NoDeviceModel(
                f"bundle_id, key_id: expected a bundle and site key the server issues device models for, received "
                f"bundle {bundle_id[:64]!r} and key {key_id[:64] or 'none'} ({why})"
            )
        if have_serial >= newest.serial:
            return recognition_pb2.DeviceModelFiles(serial=newest.serial, unchanged=True).SerializeToString()
        full = self.newest(bundle_id, key_id)
        if full is None or full.payload is None:  # withdrawn between the two reads
            raise NoDeviceModel(f"bundle_id, key_id: the device models of key {key_id or 'none'} were withdrawn")
        if not with_class_key:
            return full.payload
        key = self._class_key(full.model_version)
        if key is None:
            raise NoDeviceModel(f"bundle_id, key_id: model version {full.model_version} is no longer kept")
        msg = recognition_pb2.DeviceModelFiles.FromString(full.payload)
        for name, content in class_key_file(key).items():
            msg.files.add(name=name, content=content)
        return msg.SerializeToString(deterministic=True)

    def _class_key(self, version: str) -> bytes | None:
        try:
            return bytes.fromhex(str(self.registry.get(version).meta["device_class_salt"]))
        except (RegistryError, OSError, KeyError, ValueError, TypeError):
            return None

    def withdraw_key(self, key_id: str) -> int:
        """Withdraw every model of site key ``key_id`` (retired): never served or re-issued; returns how many."""
        if self.rows is None:
            return 0
        n = self.rows.withdraw_key(key_id, self.clock())
        with self._lock:
            self._serials.clear()
            self._payload = None
        if n:
            log.info("device models withdrawn", extra={"key_id": key_id, "models": n})
        return n

    def get(self, serial: int) -> IssuedModel | None:
        """Model ``serial`` (no files), read again after a few seconds (a withdrawal elsewhere takes effect)."""
        if self.rows is None:
            return None
        now = time.monotonic()
        with self._lock:
            hit = self._serials.get(serial)
        if hit is not None and now - hit[0] < _SERIAL_TTL_S:
            return hit[1]
        row = self.rows.get(serial)
        with self._lock:
            self._serials[serial] = (now, row)
            while len(self._serials) > 256:
                self._serials.popitem(last=False)
        return row

    def label_map(self, version: str) -> LabelMap | None:
        """Opaque class id -> subject of ``version`` (None: the version is no longer kept, or has no salt)."""
        with self._lock:
            if version in self._maps:
                self._maps.move_to_end(version)
                return self._maps[version]
        found: LabelMap | None = None
        try:
            meta = self.registry.get(version).meta
            salt = bytes.fromhex(str(meta["device_class_salt"]))
            bg = meta.get("background_index")
            subjects = {class_id(salt, str(c)): str(c) for i, c in enumerate(meta["classes"]) if i != bg}
            found = LabelMap(version, subjects, float(meta.get("trained_at", 0.0)))
        except (RegistryError, OSError, KeyError, ValueError, TypeError):
            found = None
        with self._lock:
            self._maps[version] = found
            while len(self._maps) > _LABEL_MAPS:
                self._maps.popitem(last=False)
        return found

    def forget_versions(self) -> None:
        """Drop the label maps held (versions were purged by an erasure)."""
        with self._lock:
            self._maps.clear()

    def status(self) -> dict[str, Any]:
        """What the model status and the console show: whether models are issued, the newest, the calibration."""
        out: dict[str, Any] = {
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "last_error": self.last_error,
            "calibration": self.calibration.describe() if self.calibration is not None else None,
            "newest": None,
        }
        m = self.recogniser.model
        if self.rows is not None and m is not None:
            newest = self.rows.newest(m.bundle_id, m.key_id)
            if newest is not None and not newest.withdrawn:
                out["newest"] = newest
        return out

    def recent(self, limit: int = 20) -> list[IssuedModel]:
        """The newest models issued (any bundle and key), newest first."""
        return self.rows.recent(limit) if self.rows is not None else []

    def delete_expired_before(self, cutoff: float) -> int:
        """Retention: forget models that expired before ``cutoff`` (never the largest serial)."""
        return self.rows.delete_expired_before(cutoff) if self.rows is not None else 0
