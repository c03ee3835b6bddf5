"""Decision mode: the device runs the site's signed model on its own clean projection.

The server trains its recogniser only on locally private releases, so the model is post-processing of
those releases; the device, which sees the face anyway, may run it. A device in decision mode
(``[recognition] decide = "device"``, or ``door.decision = "device"``) therefore releases no template:

* a camera fuses the clean projections of a track's last frames (no ε: nothing leaves the device),
  rotates them with the site key, applies the model and the one decision rule
  (:mod:`peep.core.decision`), and releases only the label — an opaque class id or *unknown* — through
  k-ary randomized response at ``epsilon_label`` (:class:`peep.core.labels.RandomizedResponse`);
* a door scores the claimed subject on the device and opens without a server round trip; its access
  record (the claimed subject and whether the door opened) is spooled and sent when the server is there.

Thresholds are the device's own: the model's signed calibration set (clean projections of public faces the
model never saw) is rotated with this device's site key and scored, and :func:`peep.core.decision.
calibrate_clean` sets the unknown threshold so that, after the label mechanism, at most the model's FPIR
target of strangers is named, and the claim threshold at its FAR target.

:class:`ModelStore` keeps the current and the previous verified model in the state folder, so a device
restarted while the server is away still decides; it accepts only a newer, correctly signed model for its
own bundle and site key (:func:`peep.core.devicemodel.verify_device_model_files`), and none at all once a
model has expired.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from peep.core.decision import (
    CleanThresholds,
    accept_claims,
    calibrate_clean,
    claim_scores,
    identify_open_set,
    resolved_share,
)
from peep.core.devicemodel import CLASS_KEY, FILES, DeviceModel, DeviceModelError, verify_device_model_files
from peep.core.labels import RandomizedResponse, fpir_floor
from peep.core.reports import MAX_PROBLEM_CHARS
from peep.core.sitekey import SiteKey
from peep.edge.logs import log_event

_log = logging.getLogger("peep.edge.decide")

#: A calibration set is too small for its target when new people would pass its threshold more than this
#: many times as often as the target says (the share resolves to about 1 + 1 / (target · people) times it).
CALIBRATION_SLACK = 1.2
#: Which is a set of at least this many over the target's inverse.
CALIBRATION_SLACK_PEOPLE = 5.0


class NoDeviceModel(RuntimeError):
    """No valid device model (none yet, expired, or refused): a door stays locked, a camera releases nothing."""


class FpirBelowFloor(ValueError):
    """The model's FPIR target lies at or below what the label mechanism alone names: the device refuses to decide.

    A stranger the model calls unknown is still released as some enrolled subject with the label
    mechanism's flip probability; no threshold brings the released FPIR under it, so deciding would
    silently miss the target. The message names the enrolled count, ε_label, the floor and the ε_label (or
    the number of subjects) that would meet the target.
    """

    def __init__(self, target: float, enrolled: int, epsilon_label: float, floor: float) -> None:
        from peep.core.labels import epsilon_label_for

        self.target, self.enrolled, self.epsilon_label, self.floor = target, enrolled, epsilon_label, floor
        bound = fpir_floor(enrolled, epsilon_label)
        # Leave the model half the target: at the bare floor every stranger it names is over.
        need = epsilon_label_for(enrolled, target / 2.0)
        fits = max(0, int(target / 2.0 * math.exp(epsilon_label)))
        super().__init__(
            f"fpir: the model's target {target:.4g} is at or below the FPIR floor of this device's labels: "
            f"{enrolled} enrolled subjects at epsilon_label {epsilon_label:g} name {floor:.4g} of strangers the "
            f"model calls unknown (any epsilon-LDP label: enrolled * e^-epsilon_label = {bound:.4g}); this device "
            f"does not decide. Raise [recognition] epsilon_label to about {need:.1f} or more, "
            + (f"or enrol at most {fits} subjects, " if fits >= 1 else "")
            + "or raise the server's training.device_models.fpir"
        )


def fuse_projections(bounded: ArrayLike, domain: str) -> NDArray[np.float64]:
    """One projection from a track's frames: their mean, put back on the unit sphere for that domain.

    Parameters
    ----------
    bounded : array-like of shape (n_frames, n_components)
        The bundle's bounded (unkeyed) projections of one face, one row per frame.
    domain : str
        The mechanism's domain (:mod:`peep.core.domains`): every other domain is convex, so the mean stays in it.
    """
    U = np.atleast_2d(np.asarray(bounded, dtype=np.float64))
    if U.shape[0] < 1 or not np.all(np.isfinite(U)):
        raise ValueError(f"bounded: expected finite projections of shape (n >= 1, nc), received {U.shape}")
    m = U.mean(axis=0)
    if domain == "unit":
        norm = float(np.linalg.norm(m))
        m = m / norm if norm > 0 else U[-1]
    return np.asarray(m, dtype=np.float64)


@dataclass(frozen=True)
class Identified:
    """A camera's decision on one track window.

    Attributes
    ----------
    label : str
        What is released: the opaque class id randomized response gave, ``""`` for unknown.
    decided_unknown : bool
        What the model decided before the label mechanism (stays on the device).
    probability : float
        Best enrolled probability (stays on the device).
    frames_fused : int
    """

    label: str
    decided_unknown: bool
    probability: float
    frames_fused: int


@dataclass(frozen=True)
class Verified:
    """A door's decision on a claim (stays on the device but for ``accepted``)."""

    accepted: bool
    score: float
    threshold: float
    known: bool


class DeviceDecider:
    """The one decision rule on this device's clean projections, with a verified device model.

    Parameters
    ----------
    model : DeviceModel
        Verified (:class:`ModelStore`).
    domain : str
        The domain of this device's mechanism: its projections are the model's inputs.
    site_key : SiteKey, optional
        The device's site key (the model was trained on keyed releases; so are its queries).
    epsilon_label : float or None
        ε of one identification's label (k-ary randomized response); None for a door that only verifies.
    threads : int
        onnxruntime intra-op threads.
    random_state : None or seed
        The label mechanism's randomness: the CSPRNG; seeds only in simulations (``"seeded-noise"``).

    Raises
    ------
    NoDeviceModel
        A model that names nobody, or for other inputs than this device's.
    ValueError
        When the label mechanism alone would name more strangers than the model's FPIR target (the message
        says the ε_label and the number of subjects that could meet it).
    """

    def __init__(
        self,
        model: DeviceModel,
        *,
        domain: str,
        site_key: SiteKey | None,
        epsilon_label: float | None,
        threads: int = 1,
        random_state: object = None,
    ) -> None:
        import onnxruntime as ort

        self.model = model
        self.domain = domain
        self.site_key = site_key
        declared = model.manifest.get("domain")
        if declared is not None and declared != domain:
            raise NoDeviceModel(
                f"domain: expected a model for {domain!r} projections (this device's mechanism), "
                f"received one for {str(declared)[:32]!r}"
            )
        self.known = model.known
        if self.known.size < 1:
            raise NoDeviceModel(f"model {model.serial}: names no subject (all erased or none enrolled)")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(model.onnx, sess_options=opts, providers=["CPUExecutionProvider"])
        self._erased_cols = np.array([i for i, c in enumerate(model.classes) if c and c in model.erased], dtype=np.intp)
        self.labels: RandomizedResponse | None = None
        floor, keep = 0.0, 1.0
        if epsilon_label is not None:
            # One output per subject the model may name, plus unknown.
            self.labels = RandomizedResponse(self.known.size + 1, epsilon_label, random_state=random_state)
            floor, keep = self.labels.false_positive_floor, self.labels.keep_probability
            if floor >= model.fpir:
                raise FpirBelowFloor(model.fpir, int(self.known.size), float(epsilon_label), floor)
        try:
            P_public = self.probabilities(model.calibration)
        except Exception as exc:  # an ONNX graph that does not take this device's inputs
            raise NoDeviceModel(f"model.onnx: could not score the calibration faces ({str(exc)[:160]})") from None
        self.thresholds: CleanThresholds = calibrate_clean(
            P_public, self.known, fpir=model.fpir, far=model.far, label_false_positive=floor, label_keep=keep,
            weights=model.calibration_weights,
        )  # fmt: skip
        # Every person weighs 1 in total, so the weights add up to the number of calibration people.
        self.calibration_people = max(1, round(float(np.sum(model.calibration_weights))))
        target = self.thresholds.fpir_model_target
        self.fpir_resolved = resolved_share(target, self.calibration_people)
        if self.fpir_resolved > CALIBRATION_SLACK * target:
            log_event(_log, logging.WARNING, "calibration_set_too_small", serial=model.serial,
                      calibration_people=self.calibration_people, fpir_model_target=target,
                      fpir_resolved=self.fpir_resolved,
                      error=f"the calibration set's {self.calibration_people} public people resolve the model's "
                            f"FPIR target {target:.4g} only to {self.fpir_resolved:.4g} of new people: about "
                            f"{math.ceil(CALIBRATION_SLACK_PEOPLE / max(target, 1e-12))} are needed "
                            "(peep bundle calibrate on LFW's one-image people)")  # fmt: skip

    # ------------------------------------------------------------------ scoring

    def _keyed(self, bounded: ArrayLike) -> NDArray[np.float32]:
        X = np.atleast_2d(np.asarray(bounded, dtype=np.float64))
        if X.shape[1] != self.model.n_components:
            raise ValueError(f"bounded: expected {self.model.n_components} components, received {X.shape[1]}")
        if self.site_key is not None:
            X = self.site_key.apply(X)
        return np.ascontiguousarray(X, dtype=np.float32)

    def probabilities(self, bounded: ArrayLike) -> NDArray[np.float64]:
        """Class probabilities of clean unkeyed projections, shape (n, C), erased subjects zeroed."""
        P = np.asarray(self.session.run(["probabilities"], {"values": self._keyed(bounded)})[0], dtype=np.float64)
        if self._erased_cols.size:
            P[:, self._erased_cols] = 0.0
        return P

    def identify(self, frames: ArrayLike) -> Identified:
        """Decide on a track's frames (bounded projections, shape (n_frames, nc)) and randomise the label."""
        if self.labels is None:
            raise RuntimeError("identify: this decider was made for claims only (no epsilon_label)")
        U = np.atleast_2d(np.asarray(frames, dtype=np.float64))
        fused = fuse_projections(U, self.domain)
        P = self.probabilities(fused)
        d = identify_open_set(P, self.known, self.thresholds.unknown_threshold)
        n = self.known.size
        truth = n if bool(d.unknown[0]) else int(np.flatnonzero(self.known == d.best_class[0])[0])
        released = self.labels.release_one(truth)
        label = "" if released == n else self.model.classes[int(self.known[released])]
        return Identified(
            label=label,
            decided_unknown=bool(d.unknown[0]),
            probability=float(d.probability[0]),
            frames_fused=int(U.shape[0]),
        )

    def verify(self, frames: ArrayLike, subject: str) -> Verified:
        """Decide a claim for ``subject`` on the face's frames; a subject the model does not know is refused."""
        column = self.model.column_of(subject)
        fused = fuse_projections(frames, self.domain)
        P = self.probabilities(fused)
        score = float(claim_scores(P, [column])[0])
        accepted = bool(accept_claims([score], self.thresholds.verify_threshold)[0]) and column >= 0
        return Verified(accepted=accepted, score=score, threshold=self.thresholds.verify_threshold, known=column >= 0)

    def knows(self, subject: str) -> bool:
        """Whether the model may accept a claim for ``subject`` (enrolled, not erased)."""
        return self.model.column_of(subject) >= 0

    def describe(self) -> dict[str, Any]:
        """What the device report and the start-up line say about decision mode."""
        m, t = self.model, self.thresholds
        bound = fpir_floor(int(self.known.size), self.labels.epsilon) if self.labels is not None else None
        return {
            "mode": "device",
            "model_serial": m.serial,
            "model_version": m.model_version,
            "model_trained_at": m.trained_at,
            "model_expires_at": m.expires_at,
            "subjects": int(self.known.size),
            "epsilon_label": self.labels.epsilon if self.labels is not None else None,
            "flip_probability": self.labels.flip_probability if self.labels is not None else None,
            "fpir_target": t.fpir_target,
            "fpir_model_target": t.fpir_model_target,
            # What the labels alone name of strangers the model calls unknown, and any ε-LDP label's bound.
            "fpir_floor": self.labels.false_positive_floor if self.labels is not None else None,
            "fpir_floor_bound": bound,
            "far_target": t.far_target,
            "public_faces": t.public_faces,
            "calibration_people": self.calibration_people,
            "fpir_model_resolved": self.fpir_resolved,
        }


class ModelStore:
    """The device's current and previous verified models, in ``<state_dir>/device-model/``.

    An erasure is never undone by the device's own files: the store keeps an *erasure floor*
    (``device-model/erasure-floor``), the serial of the first model it accepted that knew of every erasure the
    device had heard of. A model is a new floor unless it is a re-issue of the one held (same version, same
    erased ids); no model older than the floor is loaded or taken, so a genuine pre-erasure model copied into
    ``current/``, a corrupt ``current/`` over an older ``previous/``, or an old model replayed on the broker
    does not bring an erased person back. The floor is written (and synced) before the model it admits.

    Parameters
    ----------
    root : path
        Folder of the two models (``current/``, ``previous/``; each the model's four files).
    public_key : Ed25519PublicKey
        The deployer's key pinned in the device's configuration.
    bundle_id, key_id : str
        This device's bundle and site key id (``""`` for none): a model for another is refused.
    clock : callable returning float
        Wall clock (expiry).
    needs_class_key : bool
        A door deciding on the device: it takes only models with their class key (``class.key``, sent by an
        authenticated ``GetDeviceModel`` call, never on the broker), without which no claim can be decided.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        public_key: Any,
        *,
        bundle_id: str,
        key_id: str,
        clock: Callable[[], float] = time.time,
        needs_class_key: bool = False,
    ) -> None:
        self.root = Path(root)
        self.needs_class_key = needs_class_key
        self.public_key = public_key
        self.bundle_id = bundle_id
        self.key_id = key_id
        self.clock = clock
        self._lock = threading.Lock()
        self._current: DeviceModel | None = None
        self._listeners: list[Callable[[DeviceModel], None]] = []
        self.refused = 0
        #: Refusals by the field that failed (signature, bundle_id, key_id, expires_at, ...): on a shared broker a
        #: device hears other sites' models too, refused as another bundle or key.
        self.refusals: dict[str, int] = {}
        self.last_refusal = ""
        self._floor: int | None = None  # read on first use (load or offer)

    def add_listener(self, fn: Callable[[DeviceModel], None]) -> None:
        """Call ``fn(model)`` when a newer model is accepted."""
        self._listeners.append(fn)

    # ------------------------------------------------------------------ disk

    def _read(self, name: str) -> DeviceModel | None:
        d = self.root / name
        if not d.is_dir():
            return None
        files = {f: (d / f).read_bytes() for f in (*FILES, CLASS_KEY) if (d / f).is_file()}
        try:
            return verify_device_model_files(files, self.public_key, bundle_id=self.bundle_id, key_id=self.key_id)
        except DeviceModelError as exc:
            log_event(_log, logging.WARNING, "device_model_unusable", folder=name, error=str(exc)[:200])
            return None

    @property
    def _floor_path(self) -> Path:
        return self.root / "erasure-floor"

    def erasure_floor(self) -> int:
        """The oldest serial this device may use (0: no model taken yet)."""
        if self._floor is None:
            self._floor = self._read_floor()
        return self._floor

    def _read_floor(self) -> int:
        path = self._floor_path
        try:
            text = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            # A device from before the floor: the held model is the floor (its previous may predate an erasure).
            newest = max((m.serial for m in (self._read("current"), self._read("previous")) if m is not None),
                         default=0)  # fmt: skip
            if newest:
                self._write_floor(newest)
            return newest
        except (OSError, UnicodeDecodeError) as exc:
            text = f"<unreadable: {exc}>"
        if text.isdigit() and len(text) <= 19:
            return int(text)
        # Damaged: nothing older than the newest stored model may serve (fail-secure; the next model heals it).
        newest = max((m.serial for m in (self._read("current"), self._read("previous")) if m is not None), default=0)
        log_event(_log, logging.WARNING, "device_model_floor_unreadable", path=str(path), content=text[:40],
                  floor=newest)  # fmt: skip
        return newest

    def _write_floor(self, serial: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self._floor_path.with_name(".erasure-floor.tmp")
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(f"{serial}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._floor_path)
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._floor = serial

    def load(self) -> DeviceModel | None:
        """The newest stored model that verifies, has not expired and is not older than the erasure floor (the
        previous one if the current fails, only when it is not older either)."""
        with self._lock:
            floor = self.erasure_floor()
            for name in ("current", "previous"):
                m = self._read(name)
                if m is not None and m.serial < floor:
                    log_event(_log, logging.WARNING, "device_model_unusable", folder=name,
                              error=f"serial: expected {floor} or later (the newest erasure this device has heard "
                              f"of), received {m.serial}")  # fmt: skip
                    continue
                if m is not None and self.needs_class_key and m.class_key is None:
                    log_event(_log, logging.WARNING, "device_model_unusable", folder=name,
                              error=f"{CLASS_KEY}: missing (a door decides only with the class key)")  # fmt: skip
                    continue
                if m is not None and not m.expired(self.clock()):
                    self._current = m
                    return m
            self._current = None
            return None

    def _write(self, files: Mapping[str, bytes]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".incoming-"))
        for name in (*FILES, CLASS_KEY):
            if name not in files:
                continue
            # The class key is a secret of the site's doors: readable by this device's user alone.
            with open(os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
                fh.write(files[name])
                fh.flush()
                os.fsync(fh.fileno())
        cur, prev = self.root / "current", self.root / "previous"
        if cur.is_dir():
            shutil.rmtree(prev, ignore_errors=True)
            os.replace(cur, prev)
        os.replace(tmp, cur)
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ updates

    @property
    def current(self) -> DeviceModel | None:
        """The model to decide with, None when there is none or it has expired."""
        m = self._current
        if m is not None and m.expired(self.clock()):
            return None
        return m

    @property
    def serial(self) -> int:
        """Serial of the held model (0: none), what a device asks the server to better."""
        return self._current.serial if self._current is not None else 0

    def offer(self, files: Mapping[str, bytes], *, source: str) -> DeviceModel | None:
        """Take a received model if it is newer, correctly signed and for this device; else keep the held one.

        Returns the accepted model, or None (the refusal is logged and counted with its reason).
        """
        with self._lock:
            held = self._current.serial if self._current is not None else None
            try:
                model = verify_device_model_files(
                    files, self.public_key, bundle_id=self.bundle_id, key_id=self.key_id, newer_than=held
                )
                if self.needs_class_key and model.class_key is None:
                    raise DeviceModelError(
                        f"{CLASS_KEY}: a door deciding on the device takes a model with its class key, which only "
                        "GetDeviceModel over gRPC sends, to a device the server registers as a door "
                        "(auth.devices[].door = true; the broker's copy has none)", "class_key",
                    )  # fmt: skip
                if model.expired(self.clock()):
                    raise DeviceModelError(
                        f"expires_at: expected a model still valid, received one that expired at {model.expires_at:.0f}"
                    )
                floor = self.erasure_floor()
                if model.serial < floor:
                    raise DeviceModelError(
                        f"serial: expected {floor} or later (the newest erasure this device has heard of), received "
                        f"{model.serial}", "erasure_floor",
                    )  # fmt: skip
            except DeviceModelError as exc:
                if exc.field == "serial":  # the one we hold, offered again: nothing to say
                    return None
                self.refused += 1
                self.refusals[exc.field] = self.refusals.get(exc.field, 0) + 1
                self.last_refusal = str(exc)[:200]
                log_event(_log, logging.WARNING, "device_model_refused", source=source, field=exc.field,
                          error=str(exc)[:200])  # fmt: skip
                return None
            held_model = self._current
            reissue = (
                held_model is not None
                and held_model.model_version == model.model_version
                and held_model.erased == model.erased
            )
            if not reissue:  # it may know of an erasure the held one did not: nothing older serves again
                self._write_floor(model.serial)
            self._write(files)
            self._current = model
        log_event(_log, logging.INFO, "device_model_accepted", source=source, serial=model.serial,
                  model_version=model.model_version, subjects=model.n_subjects,
                  expires_at=round(model.expires_at))  # fmt: skip
        for fn in self._listeners:
            try:
                fn(model)
            except Exception:
                _log.exception("device model listener failed")
        return model


class DecisionSource:
    """The decider of the held model, rebuilt when a newer model is accepted; None without a valid one.

    Parameters
    ----------
    store : ModelStore
    domain : str
        The device mechanism's domain.
    site_key : SiteKey or None
    epsilon_label : float or None
        ε of a camera's label; None for a door (claims only).
    fuse_frames : int
        Frames a camera fuses into one decision.
    choose_from : int or None
        Frames of a track a camera looks at before deciding, the ``fuse_frames`` with the largest faces
        fused (None: ``fuse_frames``, its first ones).
    min_face_score : float or None
        A camera fuses and decides only on faces the detector scored at least this (None: every face).
    random_state : None or seed
        Simulations only (``"seeded-noise"``).
    """

    def __init__(
        self,
        store: ModelStore,
        *,
        domain: str,
        site_key: SiteKey | None,
        epsilon_label: float | None,
        fuse_frames: int = 1,
        choose_from: int | None = None,
        min_face_score: float | None = None,
        random_state: object = None,
    ) -> None:
        self.store = store
        self.domain = domain
        self.site_key = site_key
        self.epsilon_label = epsilon_label
        self.fuse_frames = fuse_frames
        self.choose_from = choose_from or fuse_frames
        self.min_face_score = min_face_score
        self.random_state = random_state
        self._lock = threading.Lock()
        self._decider: DeviceDecider | None = None
        self.problem = "no device model yet"
        store.add_listener(lambda _m: self._rebuild())
        if store.current is not None:
            self._rebuild()

    def _rebuild(self) -> None:
        model = self.store.current
        with self._lock:
            if model is None:
                self._decider, self.problem = None, "no valid device model"
                return
            try:
                decider = DeviceDecider(model, domain=self.domain, site_key=self.site_key,
                                        epsilon_label=self.epsilon_label, random_state=self.random_state)  # fmt: skip
            except (NoDeviceModel, ValueError) as exc:
                self._decider, self.problem = None, str(exc)[:MAX_PROBLEM_CHARS]
                log_event(_log, logging.ERROR, "device_model_cannot_decide", serial=model.serial,
                          error=self.problem)  # fmt: skip
                return
            self._decider, self.problem = decider, ""
        log_event(_log, logging.INFO, "deciding_on_device", **decider.describe())

    def decider(self) -> DeviceDecider | None:
        """The decider to use now, None when the held model has expired or none is valid."""
        d = self._decider
        if d is not None and d.model.expired(self.store.clock()):
            self.problem = f"device model {d.model.serial} expired at {d.model.expires_at:.0f}"
            return None
        return d

    def describe(self) -> dict[str, Any]:
        """The device report's ``decision`` part."""
        d = self.decider()
        if d is not None:
            return d.describe()
        return {"mode": "device", "model_serial": None, "problem": self.problem[:MAX_PROBLEM_CHARS],
                "epsilon_label": self.epsilon_label}  # fmt: skip


class GrpcModelPuller:
    """Ask the server for a newer device model (``GetDeviceModel``) at start and every ``interval_s``.

    Parameters
    ----------
    channel : grpc.Channel
    token : str or None
        The device's bearer token.
    store : ModelStore
    interval_s : float
    stop : threading.Event
        Ends the thread.
    """

    #: Largest device model taken over gRPC.
    max_bytes = 64 * 1024 * 1024

    def __init__(self, channel: Any, token: str | None, store: ModelStore, *, interval_s: float,
                 stop: threading.Event, deadline_s: float = 30.0) -> None:  # fmt: skip
        from peep.v1 import recognition_pb2_grpc

        self._stub = recognition_pb2_grpc.RecognitionServiceStub(channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.store, self.interval_s, self.stop, self.deadline_s = store, interval_s, stop, deadline_s
        self.asked = 0
        self.thread: threading.Thread | None = None

    def pull(self) -> DeviceModel | None:
        """Ask once; the accepted model, or None (unchanged, none on the server, or not reachable)."""
        import grpc
        from peep.core.exceptions import WireError
        from peep.core.wire import device_model_files
        from peep.v1 import recognition_pb2

        self.asked += 1
        req = recognition_pb2.GetDeviceModelRequest(
            bundle_id=self.store.bundle_id, key_id=self.store.key_id, have_serial=self.store.serial
        )
        try:
            resp = self._stub.GetDeviceModel(req, metadata=self._metadata, timeout=self.deadline_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            log_event(_log, logging.INFO if code == grpc.StatusCode.NOT_FOUND else logging.WARNING,
                      "device_model_not_fetched", code=str(code), error=str(exc.details() if hasattr(exc, "details")
                                                                                 else exc)[:200])  # fmt: skip
            return None
        if resp.unchanged:
            return None
        try:
            files = device_model_files(resp, max_bytes=self.max_bytes)
        except WireError as exc:
            log_event(_log, logging.WARNING, "device_model_refused", source="grpc", error=str(exc)[:200])
            return None
        return self.store.offer(files, source="grpc")

    def start(self) -> None:
        def loop() -> None:
            while not self.stop.is_set():
                self.pull()
                self.stop.wait(self.interval_s)

        self.thread = threading.Thread(target=loop, name="peep-device-model", daemon=True)
        self.thread.start()
