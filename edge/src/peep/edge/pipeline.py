"""Per-frame processing: detect -> track -> policy -> normalise -> project -> perturb -> spool.

:class:`FramePipeline` holds the injected parts (detector, tracker, policy,
releaser, spool, optional soft-trait releaser) and turns frames into
spooled templates. It is what the agent, the enrolment mode and the
benchmark run; nothing here touches the network.

Pixels stop here: a released template holds the perturbed coefficients and
metadata only (the wire schema has no field for pixels). Face crops exist in
memory for the duration of one release.

A full disk stops releases, it does not crash the device: a release is
charged to the ledger before it is queued, so before charging the pipeline
asks ``room()`` (free space on the state folders) and releases nothing while
there is none. A charge the ledger refuses (disk full) is no charge: nothing
is released. A template charged whose queueing then failed (the disk filled in
between) is kept in memory and queued before anything else is released, so a
charge never stands without its template while the process lives.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from peep.core.accounting import PrivacyAccountant, ReleaseCost
from peep.core.exceptions import BudgetError
from peep.core.imaging import FaceBox, FaceDetector, normalise_face, primary_face
from peep.core.release import TemplateReleaser
from peep.core.wire import encode_template, make_decision, make_template
from peep.edge.capture import Frame
from peep.edge.detection import BoxRefiner
from peep.edge.embedding import DescriptorEncoder
from peep.edge.logs import log_event
from peep.edge.metrics import EdgeMetrics
from peep.edge.policy import ReleasePolicy
from peep.edge.soft import SoftTraitReleaser, face_crop_rgb
from peep.edge.spool import Spool, is_disk_full
from peep.edge.tracking import Track, Tracker

_log = logging.getLogger("peep.edge.pipeline")

STAGES = ("decode", "detect", "track", "project", "perturb", "decide", "soft", "spool", "publish")


@dataclass
class StageTimer:
    """Accumulated seconds and calls per pipeline stage (for the bench and debugging)."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, stage: str, dt: float, n: int = 1) -> None:
        self.seconds[stage] += dt
        self.calls[stage] += n

    def mean_ms(self, stage: str) -> float:
        n = self.calls.get(stage, 0)
        return 1e3 * self.seconds.get(stage, 0.0) / n if n else 0.0


@dataclass(frozen=True)
class Released:
    """What one release produced (for callers and tests; the payload is what is sent)."""

    message_id: str
    track_id: str
    payload: bytes
    box: FaceBox


def largest_faces(seen: list[tuple[float, Any]], n: int) -> list[Any]:
    """The projections of the ``n`` largest faces of ``seen`` ((face height, projection) in frame order),
    in frame order; of equal heights the later. The largest are the nearest views, the least blurred by a
    walk across the frame."""
    order = sorted(range(len(seen)), key=lambda i: (seen[i][0], i))[-n:] if n > 0 else []
    return [seen[i][1] for i in sorted(order)]


class FramePipeline:
    """Turn frames into spooled templates under the release policy.

    Parameters
    ----------
    device_id, site : str
    detector : FaceDetector
        Tracking detector.
    tracker : Tracker
    policy : ReleasePolicy
    releaser : TemplateReleaser
        From :func:`peep.core.release.secure_releaser` (secure sampler).
    spool : Spool
    refine : bool
        Re-detect at full resolution with the bundle's detector settings before releasing
        (:class:`~peep.edge.detection.BoxRefiner`).
    soft : SoftTraitReleaser, optional
    metrics : EdgeMetrics, optional
    clock : callable returning float
        Wall clock for ``capture_time``.
    on_release : callable, optional
        ``on_release(released, frame)`` after a template is spooled: a local
        observer (dashboards, the demo's ground truth). It sees what is sent,
        never the face crop.
    encoder : DescriptorEncoder, optional
        For a bundle whose projector takes a face descriptor instead of pixels
        (:func:`peep.edge.embedding.encoder_for_bundle`): computed from the
        frame and the box for faces being released, and for faces the tracker
        asks to compare (``track_by_appearance``).
    sign : callable, optional
        ``sign(msg)`` sets the device's signature on a finished message
        (:meth:`peep.edge.device_key.DeviceKey.sign`), before it is encoded.
    track_by_appearance : bool
        With a descriptor ``encoder``, the tracker compares faces' descriptors where positions leave it unsure
        (:class:`~peep.edge.tracking.Tracker`); the descriptors stay in the device's memory.
    """

    def __init__(
        self,
        *,
        device_id: str,
        site: str,
        detector: FaceDetector,
        tracker: Tracker,
        policy: ReleasePolicy,
        releaser: TemplateReleaser,
        spool: Spool,
        refine: bool = True,
        soft: SoftTraitReleaser | None = None,
        metrics: EdgeMetrics | None = None,
        clock: Callable[[], float] = time.time,
        on_release: Callable[[Released, Frame], None] | None = None,
        encoder: DescriptorEncoder | None = None,
        decisions: Any = None,
        room: Callable[[], bool] | None = None,
        sign: Callable[[Any], None] | None = None,
        track_by_appearance: bool = True,
    ) -> None:
        self.device_id = device_id
        self.sign = sign
        # Whether the state folders have room for a release's writes (None: not checked).
        self.room = room
        # Charged templates whose queueing failed on a full disk: (message_id, purpose, payload), queued first.
        self.unspooled: list[tuple[str, str, bytes]] = []
        self._disk_full = False
        # Decision mode (peep.edge.decide.DecisionSource): release a randomised label per track window, no template.
        self.decisions = decisions
        self._track_frames: dict[str, list[Any]] = {}
        self.on_release = on_release
        self.site = site
        self.detector = detector
        self.tracker = tracker
        self.policy = policy
        self.spool = spool
        self.refine = refine
        self.refiner: BoxRefiner | None = None
        self.soft = soft
        self.metrics = metrics or EdgeMetrics()
        self.clock = clock
        self.timer = StageTimer()
        self.releaser = releaser
        # Whether the tracker may compare faces' descriptors (a descriptor bundle's encoder) where positions
        # leave it unsure.
        self.track_by_appearance = track_by_appearance
        self.set_releaser(releaser, encoder)

    def encode(self, msg: Any) -> bytes:
        """``msg`` signed by the device (when it has a key) and encoded: what is spooled and sent."""
        if self.sign is not None:
            self.sign(msg)
        return encode_template(msg)

    def set_releaser(self, releaser: TemplateReleaser, encoder: DescriptorEncoder | None = None) -> None:
        """Swap the releaser (bundle update); the mechanism comes from the device config only.

        ``encoder`` is the descriptor encoder the new bundle's input needs (None for pixels).
        """
        if not releaser.mechanism.is_secure:
            raise RuntimeError("the release mechanism is not on the secure sampler; refusing to release")
        kind = getattr(releaser.bundle, "input_kind", "pixels")
        if (kind == "pixels") != (encoder is None) or (encoder is not None and encoder.kind != kind):
            raise RuntimeError(
                f"bundle {releaser.bundle_id} takes {kind!r} input: expected "
                f"{'no encoder' if kind == 'pixels' else 'its ' + kind + ' encoder'}, received "
                f"{type(encoder).__name__ if encoder is not None else 'none'}"
            )
        self.encoder = encoder
        self.releaser = releaser
        # The one place a release's cost is computed: the policy's budget
        # checks read it from here, so a bundle update cannot leave them stale.
        self.cost = ReleaseCost.of(releaser.mechanism, soft_epsilon=self.soft.epsilon if self.soft else 0.0)
        self.policy.cost_epsilon = self.cost.total_vector
        self.policy.cost_delta = self.cost.delta
        if self.decisions is not None:
            # A decision's label is the whole release: its ε is what a track window costs.
            self.policy.cost_epsilon = float(self.decisions.epsilon_label)
            self.policy.cost_delta = 0.0
        self.metrics.mechanism_epsilon.labels(scope="vector").set(self.epsilon_vector)
        self.metrics.mechanism_epsilon.labels(scope="coordinate").set(self.epsilon_coordinate)
        self.refiner = BoxRefiner(releaser.bundle.normalisation) if self.refine else None

    @property
    def epsilon_vector(self) -> float:
        """Per-vector ε of one template."""
        return self.cost.epsilon_vector

    @property
    def epsilon_coordinate(self) -> float:
        """Per-coordinate ε of one template."""
        return self.cost.epsilon_coordinate

    @property
    def delta(self) -> float:
        return self.cost.delta

    @property
    def release_cost(self) -> float:
        """Per-vector ε charged for one release (template + soft traits)."""
        return self.cost.total_vector

    # -- frames ------------------------------------------------------------------------

    def process(self, frame: Frame) -> list[Released]:
        """Detect, track and release what the policy allows for one frame."""
        self.metrics.frames.inc()
        t0 = time.perf_counter()
        boxes = self.detector.detect(frame.image)
        t1 = time.perf_counter()
        self.timer.add("detect", t1 - t0)
        if boxes:
            self.metrics.faces.inc(len(boxes))
        appearance = None
        if self.encoder is not None and self.track_by_appearance:
            encoder = self.encoder

            def appearance(i: int) -> Any:
                # the detector's box, not the refined one: the descriptor aligns the face itself, and only a
                # face being released is worth the refinement's second detection
                return encoder.encode(frame.image, boxes[i])

        tracks = self.tracker.update(boxes, frame.timestamp, frame.image.shape, appearance=appearance)
        self.timer.add("track", time.perf_counter() - t1)
        # A face cut by the frame's edge, or one the tracker has yet to tell from another's, is neither released
        # nor decided on: its track may be someone else's.
        tracks = [tr for tr in tracks if tr.clear_view]
        out: list[Released] = []
        if self.unspooled and not self.flush_unspooled():
            return out  # what was charged is queued before anything more is released
        if self.decisions is not None:
            return self._decide_tracks(frame, tracks)
        for tr in tracks:
            if self.policy.decide(tr, frame.timestamp).allowed:
                rel = self._release_track(frame, tr)
                if rel is not None:
                    out.append(rel)
        return out

    # -- a full disk -----------------------------------------------------------------

    def _set_disk_full(self, full: bool, **fields: Any) -> None:
        """Log when releasing stops for a full disk and when it resumes (once each, not every frame)."""
        if full and not self._disk_full:
            log_event(_log, logging.ERROR, "releases_stopped_disk_full", **fields)
        elif not full and self._disk_full:
            log_event(_log, logging.WARNING, "releases_resumed_disk_space", **fields)
        self._disk_full = full

    def may_charge(self, track_id: str) -> bool:
        """Whether a release may be charged now: the state folders have room for its ledger entry and spool row.

        Asked before the charge, so a full disk stops the release with nothing charged.
        """
        if self.room is None:
            return True
        if self.room():
            self._set_disk_full(False)
            return True
        self.policy._suppress("disk_full")
        self._set_disk_full(True, track=track_id)
        return False

    def _charge(self, spend: Callable[[], Any], track_id: str) -> bool:
        """Run ``spend``; False when the ledger refused it for a full disk (SQLite rolled it back: no charge)."""
        try:
            spend()
        except sqlite3.OperationalError as exc:
            if not is_disk_full(exc):
                raise
            self.policy._suppress("disk_full")
            self._set_disk_full(True, track=track_id, error=str(exc))
            return False
        return True

    def _queue(self, message_id: str, purpose: str, payload: bytes) -> None:
        """Queue a charged template; on a full disk keep it in memory for :meth:`flush_unspooled`."""
        try:
            self.spool.put(message_id=message_id, purpose=purpose, payload=payload)
        except sqlite3.OperationalError as exc:
            if not is_disk_full(exc):
                raise
            self.unspooled.append((message_id, purpose, payload))
            self._set_disk_full(True, message_id=message_id, error=str(exc))
            log_event(_log, logging.WARNING, "release_queue_deferred", message_id=message_id,
                      held=len(self.unspooled))  # fmt: skip

    def flush_unspooled(self) -> bool:
        """Queue the charged templates a full disk held back, oldest first; True when none is left."""
        while self.unspooled:
            message_id, purpose, payload = self.unspooled[0]
            try:
                self.spool.put(message_id=message_id, purpose=purpose, payload=payload)
            except sqlite3.OperationalError as exc:
                if not is_disk_full(exc):
                    raise
                return False
            self.unspooled.pop(0)
        self._set_disk_full(False)
        return True

    # -- decision mode -------------------------------------------------------------

    def _projector_input(self, frame: Frame, box: FaceBox) -> tuple[FaceBox, Any]:
        """The (refined) box and what the bundle's projector takes for it: a descriptor or a normalised face."""
        if self.refiner is not None:
            box = self.refiner.refine(frame.image, box)
        if self.encoder is not None:
            # A descriptor bundle: the network sees the frame around the box (its own alignment).
            return box, self.encoder.encode(frame.image, box)
        return box, normalise_face(frame.image, box, self.releaser.bundle.geometry)

    def project_face(self, frame: Frame, box: FaceBox) -> Any:
        """The bundle's clean bounded (unkeyed) projection of one face, shape (n_components,); stays here."""
        return self.releaser.project(self._projector_input(frame, box)[1])[0]

    def _decide_tracks(self, frame: Frame, tracks: list[Track]) -> list[Released]:
        # The frames before a track's first decision that it may fuse: the last ``choose_from`` of them.
        lead = self.policy.min_hits - int(self.decisions.choose_from)
        out: list[Released] = []
        alive = {tr.id for tr in tracks}
        for gone in [k for k in self._track_frames if k not in alive]:
            del self._track_frames[gone]
        least = self.decisions.min_face_score
        for tr in tracks:
            # A face the detector doubts (YuNet's score falls as a face is covered) is neither fused nor decided on:
            # the track waits for fuse_frames faces it does not doubt.
            clear = least is None or tr.box.score >= least
            if self.policy.decide(tr, frame.timestamp).allowed:
                if not clear:
                    continue
                held = self._track_frames.get(tr.id, [])
                if least is not None and len(held) + 1 < int(self.decisions.fuse_frames):
                    self._collect(frame, tr)
                    continue
                rel = self._decide_track(frame, tr)
                if rel is not None:
                    out.append(rel)
            elif clear and lead < tr.hits < self.policy.min_hits and self.decisions.decider() is not None:
                self._collect(frame, tr)
        return out

    def _collect(self, frame: Frame, tr: Track) -> None:
        """Keep this frame's clean projection of the track's face for its decision (the last ``choose_from``)."""
        t0 = time.perf_counter()
        held = self._track_frames.setdefault(tr.id, [])
        held.append((tr.box.h, self.project_face(frame, tr.box)))
        del held[: max(0, len(held) - int(self.decisions.choose_from))]
        self.timer.add("project", time.perf_counter() - t0)

    def _decide_track(self, frame: Frame, track: Track) -> Released | None:
        """Decide on a track's fused clean projections and spool the randomised label (one window's release)."""
        decider = self.decisions.decider()
        if decider is None:  # no valid model: a camera in decision mode releases nothing
            self.policy._suppress("no_model")
            return None
        t0 = time.perf_counter()
        seen = self._track_frames.pop(track.id, [])
        seen.append((track.box.h, self.project_face(frame, track.box)))
        frames = largest_faces(seen, int(self.decisions.fuse_frames))
        t1 = time.perf_counter()
        decided = decider.identify(frames)
        t2 = time.perf_counter()
        self.timer.add("project", t1 - t0)
        self.timer.add("decide", t2 - t1)
        eps = float(decider.labels.epsilon)  # type: ignore[union-attr]
        msg = make_decision(
            device_id=self.device_id,
            site=self.site,
            bundle_id=self.releaser.bundle_id,
            key_id=self.releaser.key_id,
            model_serial=decider.model.serial,
            model_version=decider.model.model_version,
            purpose="identify",
            label=decided.label,
            epsilon_label=eps,
            labels=decider.labels.k,  # type: ignore[union-attr]
            frames_fused=decided.frames_fused,
            track_id=track.id,
            capture_time=self.clock(),
        )
        if not self.may_charge(track.id):
            return None
        try:
            charged = self._charge(lambda: self.policy.record(track, frame.timestamp, epsilon=eps, delta=0.0,
                                                              epsilon_coordinate=eps, message_id=msg.message_id),
                                   track.id)  # fmt: skip
        except BudgetError as exc:
            log_event(_log, logging.WARNING, "release_refused_budget", track=track.id, epsilon_vector=eps,
                      error=str(exc))  # fmt: skip
            return None
        if not charged:
            return None
        payload = self.encode(msg)
        self._queue(msg.message_id, "identify", payload)
        self.timer.add("spool", time.perf_counter() - t2)
        self.metrics.releases.labels(purpose="identify").inc()
        log_event(_log, logging.INFO, "decision_release", track=track.id, message_id=msg.message_id,
                  mechanism="k-rr", epsilon_label=eps, frames_fused=decided.frames_fused,
                  model_serial=decider.model.serial)  # fmt: skip
        released = Released(message_id=msg.message_id, track_id=track.id, payload=payload, box=track.box)
        if self.on_release is not None:
            self.on_release(released, frame)
        return released

    def _release_track(self, frame: Frame, track: Track) -> Released | None:
        def spend(cost: float, coord: float, message_id: str) -> None:
            self.policy.record(
                track,
                frame.timestamp,
                epsilon=cost,
                delta=self.delta,
                epsilon_coordinate=coord,
                message_id=message_id,
            )

        return self.release_face(frame, track.box, track_id=track.id, spend=spend, purpose="identify")

    def release_face(
        self,
        frame: Frame,
        box: FaceBox,
        *,
        track_id: str,
        spend: Callable[[float, float, str], None],
        purpose: str,
        subject: str = "",
        spool: bool = True,
        message_id: str | None = None,
        claim_signature: str = "",
    ) -> Released | None:
        """Normalise, project, perturb, spend, encode and spool one face.

        ``spool=False``: the caller sends the payload itself (a door's verification, answered in the call);
        the spend is recorded all the same. ``message_id``: the template's id when the caller binds an answer
        to it (a door claim's nonce); a fresh one otherwise. ``claim_signature``: a door's VERIFY carries the
        server's signed answer to its claim check back to the server.

        ``spend(epsilon_vector_total, epsilon_coordinate, message_id)`` persists
        the privacy cost after the noise is drawn and before the template is
        queued; if it raises :class:`BudgetError` nothing is queued.
        """
        t0 = time.perf_counter()
        box, face = self._projector_input(frame, box)
        bounded = self.releaser.project(face)
        t1 = time.perf_counter()
        values = self.releaser.release_bounded(bounded)[0]
        t2 = time.perf_counter()
        self.timer.add("project", t1 - t0)
        self.timer.add("perturb", t2 - t1)
        traits: list[dict[str, Any]] = []
        if self.soft is not None:
            try:
                traits = self.soft.release(face_crop_rgb(frame.image, box))
            except (ValueError, RuntimeError) as exc:
                log_event(_log, logging.WARNING, "soft_traits_failed", track=track_id, error=str(exc))
            self.timer.add("soft", time.perf_counter() - t2)
        del face
        t3 = time.perf_counter()
        soft_eps = sum(float(t["epsilon"]) for t in traits)
        msg = make_template(
            values,
            device_id=self.device_id,
            site=self.site,
            bundle_id=self.releaser.bundle_id,
            mechanism=self.releaser.description,
            purpose=purpose,
            subject=subject,
            track_id=track_id,
            capture_time=self.clock(),
            soft_traits=traits,
            key_id=self.releaser.key_id,
            message_id=message_id,
        )
        if claim_signature:
            msg.claim_signature = claim_signature
        if not self.may_charge(track_id):
            return None
        try:
            charged = self._charge(
                lambda: spend(self.epsilon_vector + soft_eps, self.epsilon_coordinate, msg.message_id), track_id
            )
        except BudgetError as exc:
            log_event(
                _log,
                logging.WARNING,
                "release_refused_budget",
                track=track_id,
                epsilon_coordinate=self.epsilon_coordinate,
                epsilon_vector=self.epsilon_vector + soft_eps,
                error=str(exc),
            )
            return None
        if not charged:
            return None
        payload = self.encode(msg)
        if spool:
            self._queue(msg.message_id, purpose, payload)
        self.timer.add("spool", time.perf_counter() - t3)
        self.metrics.releases.labels(purpose=purpose).inc()
        log_event(
            _log,
            logging.INFO,
            "release",
            purpose=purpose,
            track=track_id,
            message_id=msg.message_id,
            mechanism=self.releaser.kind,
            epsilon_coordinate=self.epsilon_coordinate,
            epsilon_vector=self.epsilon_vector,
            soft_epsilon=soft_eps,
            bundle_id=self.releaser.bundle_id,
        )
        released = Released(message_id=msg.message_id, track_id=track_id, payload=payload, box=box)
        if self.on_release is not None:
            self.on_release(released, frame)
        return released


class EnrollSession:
    """Enrolment: the primary face of each frame becomes an ENROLL template for ``subject``.

    Spends under ``subject:<id>`` (budget ``privacy.enroll_budget`` when set).
    Images are never written anywhere.
    """

    def __init__(
        self,
        pipeline: FramePipeline,
        accountant: PrivacyAccountant,
        *,
        subject: str,
        device_key: str | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.accountant = accountant
        self.subject = subject
        self.device_key = device_key
        self.key = f"subject:{subject}"
        self.released = 0

    def process(self, frame: Frame) -> Released | None:
        p = self.pipeline
        p.metrics.frames.inc()
        boxes = p.detector.detect(frame.image)
        if boxes:
            p.metrics.faces.inc(len(boxes))
        box = primary_face(boxes, frame.image.shape)
        if box is None:
            return None
        cost = p.release_cost
        self.accountant.check(self.key, cost, p.delta)
        if self.device_key is not None:
            self.accountant.check(self.device_key, cost, p.delta)

        def spend(eps: float, coord: float, message_id: str) -> None:
            for key in (self.device_key, self.key):
                if key is not None:
                    self.accountant.spend(
                        key, eps, p.delta, epsilon_coordinate=coord, purpose="enroll", message_id=message_id
                    )

        rel = p.release_face(
            frame,
            box,
            track_id=f"enroll-{frame.index}",
            spend=spend,
            purpose="enroll",
            subject=self.subject,
        )
        if rel is not None:
            self.released += 1
        return rel
