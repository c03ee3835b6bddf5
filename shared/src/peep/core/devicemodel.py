"""The device model: a promoted recogniser, signed, for devices that decide on their own clean projection.

The server trains recognisers only on locally private releases, so a trained model is post-processing of
those releases and can go to the device, the one party PEEP trusts (it sees the face anyway), without
widening what anyone learns. A device in decision mode runs it on its clean (site-keyed) projection and
releases only a decision. What travels, as four files like a bundle's:

``model.onnx``
    The recogniser: input ``values`` (N, nc) float32 → ``probabilities`` (N, C).
``calibration.npy``
    Clean, *unkeyed* projections of public faces the model never saw (shape (n, nc), float32): public
    faces through the public bundle, which anyone can compute. The device rotates them with its own site
    key and sets its thresholds on them (:func:`peep.core.decision.calibrate_clean`): a model trained on
    noisy releases meets clean queries of another scale, and the server, which never holds the site key,
    cannot score keyed clean projections itself.
``manifest.json``
    What the model is and whom it decides: ``serial`` (strictly increasing; a device takes only a newer
    one), the server's ``model_version``, the ``bundle_id`` and site-key ``key_id`` it was trained under,
    ``classes`` as **opaque ids** (subject names stay on the server), the SHA-256 of the *class key*
    under which they are made, ``erased`` ids (columns a device must never name) under the same key, the
    FPIR/FAR targets, and the SHA-256 of the two files above.
``signature.json``
    Ed25519 over the manifest (:func:`peep.core.signing.sign_document`), by the deployer's key.

A class id is HMAC-SHA256 of the subject's name under the model version's class key: 16 random bytes the
server keeps and never writes into these files, which go to every listener of the broker's model topic.
Without the key an id links to no name, however many names one tries. A door, which must turn a badge's
subject into its column, gets the key as a fifth file, ``class.key``, only from an authenticated
``GetDeviceModel`` call; it is checked against the signed hash. Whoever holds such a door's disk holds the
key and can test names offline (see docs/DECISIONS.md for what that yields).

:func:`verify_device_model_files` trusts nothing before the signature verifies against the pinned key,
then refuses, each by name, a model of another format, bundle or site key, an older or equal serial, and a
file whose hash differs from the signed manifest.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from peep.core.signing import sign_document, verify_document

FORMAT: Final = "peep-device-model/1"
MODEL: Final = "model.onnx"
CALIBRATION: Final = "calibration.npy"
MANIFEST: Final = "manifest.json"
SIGNATURE: Final = "signature.json"
FILES: Final = (MODEL, CALIBRATION, MANIFEST, SIGNATURE)
_DOMAIN: Final = b"peep-device-model/1"
#: Largest device model accepted, all files together (a one-hidden-layer MLP of 512 units on 128 inputs
#: and a few thousand calibration faces are well under 10 MB).
MAX_BYTES: Final = 64 * 1024 * 1024
#: The optional fifth file: the version's class key (hex), for doors only; never broadcast.
CLASS_KEY: Final = "class.key"
_KEY_BYTES: Final = 16


class DeviceModelError(ValueError):
    """A device model is malformed, tampered, or not for this device; the message names the field or file."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field or message.partition(":")[0]


def class_id(key: bytes, subject: str) -> str:
    """A subject's opaque id in one model version: HMAC-SHA256 of the subject under its class key, 24 hex.

    The key is fresh for every trained version, so the ids of one version do not link to another's.
    """
    return hmac.new(key, subject.encode("utf-8"), hashlib.sha256).hexdigest()[:24]


def class_key_sha256(key: bytes) -> str:
    """What the signed manifest says of the class key: its SHA-256 (hex)."""
    return hashlib.sha256(key).hexdigest()


def class_key_file(key: bytes) -> dict[str, bytes]:
    """The ``class.key`` file a door receives beside a model's four files."""
    return {CLASS_KEY: key.hex().encode("ascii")}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def _npy(array: NDArray[np.float32]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array, dtype="<f4"), allow_pickle=False)
    return buf.getvalue()


@dataclass(frozen=True)
class DeviceModel:
    """A verified device model (see the module docstring).

    Attributes
    ----------
    serial : int
        Strictly increasing over the models a server issues.
    model_version : str
        The server's model version it was made from (events name it).
    bundle_id, key_id : str
        What its inputs must be: projections of this bundle, rotated by the site key with this id.
    classes : tuple of str
        Opaque id of each probability column; ``""`` for the background column.
    background_index : int or None
    erased : frozenset of str
        Opaque ids of subjects erased since training: never named, never accepted.
    class_key : bytes or None
        The version's class key when the device was given it (a door, over an authenticated call); None
        otherwise: ids then name no one, and no claim can be decided.
    n_components : int
    fpir, far : float
        Targets of the device's thresholds (identification, claims).
    issued_at, trained_at, expires_at : float
        Unix times. A device refuses to decide with an expired model: the server re-issues a live model
        (a new serial) well before it expires, so a device that cannot hear from it for longer -- or whose
        site key was retired, or from which the newest model was withheld -- stops deciding.
    onnx : bytes
    calibration : ndarray of float32, shape (n_public, n_components)
        Clean unkeyed projections of public faces the model never saw.
    manifest : dict
        Everything signed, as read.
    """

    serial: int
    model_version: str
    bundle_id: str
    key_id: str
    classes: tuple[str, ...]
    background_index: int | None
    erased: frozenset[str]
    class_key: bytes | None
    n_components: int
    fpir: float
    far: float
    issued_at: float
    trained_at: float
    expires_at: float
    onnx: bytes = field(repr=False)
    calibration: NDArray[np.float32] = field(repr=False)
    manifest: dict[str, Any] = field(repr=False)

    @property
    def known(self) -> NDArray[np.intp]:
        """Columns of enrolled subjects that may be named (not the background, not erased)."""
        return np.array(
            [i for i, c in enumerate(self.classes) if i != self.background_index and c not in self.erased],
            dtype=np.intp,
        )

    @property
    def n_subjects(self) -> int:
        return int(self.known.size)

    @property
    def calibration_weights(self) -> NDArray[np.float64]:
        """Each calibration face's weight: one over the photos of its person (every person counts the same)."""
        groups = self.manifest.get("calibration", {}).get("groups")
        n = int(self.calibration.shape[0])
        if not isinstance(groups, list) or len(groups) != n:
            return np.ones(n)
        _, inverse, counts = np.unique(np.asarray(groups, dtype=np.int64), return_inverse=True, return_counts=True)
        return 1.0 / counts[inverse]

    def column_of(self, subject: str) -> int:
        """The column of a claimed subject, ``-1`` when the model does not know them (or they were erased), or
        when this device does not hold the class key."""
        if self.class_key is None:
            return -1
        cid = class_id(self.class_key, subject)
        if cid in self.erased:
            return -1
        try:
            i = self.classes.index(cid)
        except ValueError:
            return -1
        return -1 if i == self.background_index else i

    def expired(self, now: float | None = None) -> bool:
        """Whether the model may no longer decide."""
        return (time.time() if now is None else now) >= self.expires_at

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the model it came from was trained."""
        return max(0.0, (time.time() if now is None else now) - self.trained_at)


def build_device_model_files(
    *,
    onnx: bytes,
    calibration: NDArray[np.float32],
    subjects: Sequence[str],
    background_index: int | None,
    serial: int,
    model_version: str,
    bundle_id: str,
    key_id: str,
    n_components: int,
    trained_at: float,
    signing_key: Any,
    fpir: float = 0.01,
    far: float = 0.001,
    erased: Sequence[str] = (),
    class_key: bytes | None = None,
    extra: Mapping[str, Any] | None = None,
    issued_at: float | None = None,
    valid_s: float = 7 * 86400.0,
    calibration_groups: Sequence[int] | None = None,
) -> dict[str, bytes]:
    """All files of a signed device model, in memory.

    Parameters
    ----------
    onnx : bytes
        The served recogniser.
    calibration : ndarray of shape (n_public, n_components)
        Clean unkeyed projections of public faces the model was never trained on.
    subjects : sequence of str
        The name of each probability column (``""`` for the background); only their opaque ids are written.
    erased : sequence of str
        Subject names erased since training (written as opaque ids).
    signing_key : Ed25519PrivateKey
        The deployer's key (devices pin its public half).
    class_key : bytes, optional
        The version's class key (at least 16 bytes; random by default, tests pass one). Only its hash is
        written: a door gets the key itself apart (:func:`class_key_file`).
    extra : mapping, optional
        More manifest fields (e.g. the preset's name).
    valid_s : float
        Seconds from ``issued_at`` to ``expires_at``.
    calibration_groups : sequence of int, optional
        The public person of each calibration face (any integers): a device weighs every person the same
        when it sets its thresholds, however many photos each has. Default: every face its own person.
    """
    cal = np.asarray(calibration, dtype=np.float32)
    if cal.ndim != 2 or cal.shape[1] != n_components or cal.shape[0] < 1:
        raise DeviceModelError(
            f"calibration: expected clean projections of shape (n >= 1, {n_components}), received {cal.shape}"
        )
    if not np.all(np.isfinite(cal)):
        raise DeviceModelError("calibration: expected finite projections, received NaN or infinity")
    if serial < 1:
        raise DeviceModelError(f"serial: expected a positive integer, received {serial!r}")
    if not valid_s > 0:
        raise DeviceModelError(f"valid_s: expected a positive number of seconds, received {valid_s!r}")
    issued = float(time.time() if issued_at is None else issued_at)
    groups = None if calibration_groups is None else [int(g) for g in calibration_groups]
    if groups is not None and len(groups) != cal.shape[0]:
        raise DeviceModelError(
            f"calibration_groups: expected one person per calibration face ({cal.shape[0]}), received {len(groups)}"
        )
    key = os.urandom(_KEY_BYTES) if class_key is None else bytes(class_key)
    if len(key) < _KEY_BYTES:
        raise DeviceModelError(f"class_key: expected at least {_KEY_BYTES} random bytes, received {len(key)}")
    ids = ["" if i == background_index else class_id(key, s) for i, s in enumerate(subjects)]
    cal_bytes = _npy(cal)
    manifest = {
        **dict(extra or {}),
        "format": FORMAT,
        "serial": int(serial),
        "model_version": model_version,
        "bundle_id": bundle_id,
        "key_id": key_id,
        "classes": ids,
        "background_index": background_index,
        "erased": sorted({class_id(key, s) for s in erased}),
        "class_key_sha256": class_key_sha256(key),
        "n_components": int(n_components),
        "targets": {"fpir": float(fpir), "far": float(far)},
        "calibration": {"faces": int(cal.shape[0]), **({"groups": groups} if groups is not None else {})},
        "trained_at": float(trained_at),
        "issued_at": issued,
        "expires_at": issued + float(valid_s),
        "files": {MODEL: _sha256(onnx), CALIBRATION: _sha256(cal_bytes)},
    }
    manifest_bytes = _canonical(manifest)
    signature = {"algorithm": "ed25519", "signature": sign_document(signing_key, _DOMAIN, manifest_bytes)}
    return {MODEL: onnx, CALIBRATION: cal_bytes, MANIFEST: manifest_bytes, SIGNATURE: _canonical(signature)}


def _class_key(files: Mapping[str, bytes], signed_sha256: str) -> bytes | None:
    """The class key sent beside the model (None when none was), checked against the signed hash."""
    raw = files.get(CLASS_KEY)
    if raw is None:
        return None
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise DeviceModelError(f"{CLASS_KEY}: expected the class key in hex", "class_key") from None
    if not hmac.compare_digest(class_key_sha256(key), signed_sha256):
        raise DeviceModelError(
            f"{CLASS_KEY}: not the class key the signed manifest names (another version's, or altered)", "class_key"
        )
    return key


def read_manifest_unverified(files: Mapping[str, bytes]) -> dict[str, Any]:
    """The manifest as JSON, *not verified*: only for showing what was refused."""
    try:
        out = json.loads(files.get(MANIFEST, b"{}"))
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def verify_device_model_files(
    files: Mapping[str, bytes],
    public_key: Any,
    *,
    bundle_id: str | None = None,
    key_id: str | None = None,
    newer_than: int | None = None,
) -> DeviceModel:
    """Check a device model's signature, hashes and fit for this device; raise :class:`DeviceModelError`.

    Parameters
    ----------
    files : mapping of file name to bytes
    public_key : Ed25519PublicKey
        The pinned key.
    bundle_id, key_id : str, optional
        The device's own bundle and site key id (``""`` for none): a model for another is refused.
    newer_than : int, optional
        The serial the device holds: a model with this serial or an older one is refused.
    """
    names = set(files)
    missing = [n for n in FILES if n not in names]
    if missing:
        raise DeviceModelError(f"{missing[0]}: missing from the device model (unsigned or incomplete)", "files")
    extra = sorted(names - set(FILES) - {CLASS_KEY})
    if extra:
        raise DeviceModelError(
            f"files: expected only {', '.join(FILES)} (and {CLASS_KEY}), received also {extra[0][:64]!r}"
        )
    total = sum(len(v) for v in files.values())
    if total > MAX_BYTES:
        raise DeviceModelError(f"files: expected at most {MAX_BYTES} bytes in all, received {total}")
    try:
        sig = json.loads(files[SIGNATURE])
        signature = sig["signature"] if isinstance(sig, dict) else None
    except ValueError as exc:
        raise DeviceModelError(f"signature: malformed {SIGNATURE} ({str(exc)[:80]})") from None
    if not verify_document(public_key, _DOMAIN, files[MANIFEST], signature):
        raise DeviceModelError(
            "signature: does not verify with the pinned key (tampered manifest, or signed by another key)"
        )
    try:
        m = json.loads(files[MANIFEST])
        if not isinstance(m, dict):
            raise TypeError("not an object")
        model = DeviceModel(
            serial=int(m["serial"]),
            model_version=str(m["model_version"]),
            bundle_id=str(m["bundle_id"]),
            key_id=str(m["key_id"]),
            classes=tuple(str(c) for c in m["classes"]),
            background_index=None if m["background_index"] is None else int(m["background_index"]),
            erased=frozenset(str(c) for c in m["erased"]),
            class_key=None,
            n_components=int(m["n_components"]),
            fpir=float(m["targets"]["fpir"]),
            far=float(m["targets"]["far"]),
            issued_at=float(m["issued_at"]),
            trained_at=float(m["trained_at"]),
            expires_at=float(m["expires_at"]),
            onnx=files[MODEL],
            calibration=np.zeros((0, 0), np.float32),
            manifest=m,
        )
        hashes = dict(m["files"])
        key_sha256 = str(m["class_key_sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DeviceModelError(f"manifest: malformed device model manifest ({str(exc)[:80]})") from None
    model = replace(model, class_key=_class_key(files, key_sha256))
    if m.get("format") != FORMAT:
        raise DeviceModelError(f"format: expected {FORMAT!r}, received {str(m.get('format'))[:64]!r}")
    if bundle_id is not None and model.bundle_id != bundle_id:
        raise DeviceModelError(
            f"bundle_id: expected {bundle_id} (this device's bundle), received a model for {model.bundle_id[:64]!r}"
        )
    if key_id is not None and model.key_id != key_id:
        raise DeviceModelError(
            f"key_id: expected {key_id or 'none'} (this device's site key), received a model trained under "
            f"{model.key_id[:64] or 'none'}"
        )
    if newer_than is not None and model.serial <= newer_than:
        raise DeviceModelError(
            f"serial: expected a model newer than the one held ({newer_than}), received serial {model.serial}"
        )
    for name in (MODEL, CALIBRATION):
        if hashes.get(name) != _sha256(files[name]):
            raise DeviceModelError(f"{name}: SHA-256 does not match the signed manifest (tampered or corrupted file)")
    if model.background_index is not None and not 0 <= model.background_index < len(model.classes):
        raise DeviceModelError(f"background_index: expected a column below {len(model.classes)}")
    try:
        cal = np.load(io.BytesIO(files[CALIBRATION]), allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise DeviceModelError(f"{CALIBRATION}: not a numpy array file ({str(exc)[:80]})") from None
    if cal.ndim != 2 or cal.shape[1] != model.n_components or cal.shape[0] < 1 or cal.dtype != np.float32:
        raise DeviceModelError(
            f"{CALIBRATION}: expected float32 projections of shape (n, {model.n_components}), received "
            f"{cal.dtype} {cal.shape}"
        )
    object.__setattr__(model, "calibration", cal)
    return model
