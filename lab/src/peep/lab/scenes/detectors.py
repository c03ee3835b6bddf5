"""Face detectors measured on scenes, per face-height bin: recall, false detections, CPU per frame.

A detection **matches** a ground-truth face when its centre lies within half the face box's height of
the box's centre and its height is 0.45-2 times the box's (detectors draw their boxes differently: dlib's
HOG tighter than the LFW crop, Haar a little looser); each face and each detection match at most once,
the highest-scoring detections first. **Recall** counts the faces at least half visible
(``visible >= 0.5``); a detection matching a face hidden more than that is neither a hit nor false. A
**false detection** matches no face at all. Time is the CPU time of ``detect`` per frame on one thread
(OpenCV's threads set to 1), decoding excluded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from peep.lab.scenes.render import read_ground_truth
from peep.lab.scenes.tracks import MIN_VISIBLE, TrackJudge

#: Face-height bins of the report, in pixels of the frame: [low, high).
HEIGHT_BINS: tuple[tuple[float, float], ...] = ((30.0, 45.0), (45.0, 70.0), (70.0, 110.0), (110.0, float("inf")))


def bin_label(lo: float, hi: float) -> str:
    return f"{lo:g}-{hi:g}" if np.isfinite(hi) else f">={lo:g}"


def match_frame(truth: Sequence[dict[str, Any]], boxes: Sequence[Any]) -> tuple[list[int | None], int]:
    """(for each ground-truth face the index of its detection or None, the number of false detections)."""
    order = sorted(range(len(boxes)), key=lambda i: -float(getattr(boxes[i], "score", 0.0)))
    taken: list[int | None] = [None] * len(truth)
    false = 0
    for i in order:
        b = boxes[i]
        cx, cy = b.x + b.w / 2, b.y + b.h / 2
        best, best_d = None, np.inf
        for j, face in enumerate(truth):
            if taken[j] is not None:
                continue
            x, y, w, h = face["box"]
            d = float(np.hypot(cx - (x + w / 2), cy - (y + h / 2)))
            if d <= 0.5 * h and 0.45 <= b.h / h <= 2.0 and d < best_d:
                best, best_d = j, d
        if best is None:
            false += 1
        else:
            taken[best] = i
    return taken, false


def evaluate(
    detector: Any,
    scenes: Sequence[str | Path],
    *,
    make_tracker: Callable[[], Any] | None = None,
    encoder: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run ``detector`` on every frame of each scene (``<scene>.mp4`` beside ``<scene>.gt.jsonl``).

    With ``make_tracker`` (a fresh tracker per scene, e.g. the edge's ``Tracker``) the detections are also
    tracked and judged against the passes (:class:`peep.lab.scenes.tracks.TrackJudge`): ``tracks``. With
    ``encoder`` (the edge's descriptor encoder, ``encode(image, box)``) the tracker may compare faces, as a
    device with a descriptor bundle does; ``tracks`` then also has the descriptors computed per detection.

    Returns
    -------
    dict
        ``frames``, ``faces`` and ``recall`` per bin (and below 30 px), ``recall_45_up``,
        ``false_per_1000_frames``, ``cpu_ms_per_frame`` (mean and p95).
    """
    import cv2

    cv2.setNumThreads(1)
    judge = TrackJudge() if make_tracker is not None else None
    hits = {bin_label(*b): [0, 0] for b in ((0.0, 30.0), *HEIGHT_BINS)}
    false = frames = 0
    cpu: list[float] = []
    total = detections = described = 0
    truths = [read_ground_truth(Path(s).with_suffix(".gt.jsonl")) for s in scenes]
    n_all = sum(len(t) for t in truths)
    for scene, truth in zip(scenes, truths, strict=True):
        cap = cv2.VideoCapture(str(Path(scene).with_suffix(".mp4")))
        tracker = None
        described_before = 0
        if judge is not None and make_tracker is not None:
            tracker = make_tracker()
            judge.start(Path(scene).name)
        try:
            for record in truth:
                ok, image = cap.read()
                if not ok:
                    raise ValueError(f"{scene}: the video ends at frame {record['frame']}, its ground truth does not")
                t0 = time.process_time()
                boxes = detector.detect(image)
                cpu.append(time.process_time() - t0)
                detections += len(boxes)
                taken, n_false = match_frame(record["faces"], boxes)
                if tracker is not None and judge is not None:
                    if encoder is None:
                        tracks = tracker.update(boxes, float(record["t"]), image.shape)
                    else:

                        def appearance(i: int, image: Any = image, boxes: Any = boxes) -> Any:
                            return encoder.encode(image, boxes[i])

                        tracks = tracker.update(boxes, float(record["t"]), image.shape, appearance=appearance)
                    clear = [bool(getattr(t, "clear_view", True)) for t in tracks]
                    held = [bool(getattr(t, "held", False)) for t in tracks]
                    judge.feed(record["faces"], taken, [t.id for t in tracks], clear, held)
                    described += int(getattr(tracker, "described", 0)) - described_before
                    described_before = int(getattr(tracker, "described", 0))
                false += n_false
                frames += 1
                for face, hit in zip(record["faces"], taken, strict=True):
                    if face["visible"] < MIN_VISIBLE:
                        continue
                    h = float(face["height_px"])
                    for lo, hi in ((0.0, 30.0), *HEIGHT_BINS):
                        if lo <= h < hi:
                            cell = hits[bin_label(lo, hi)]
                            cell[0] += hit is not None
                            cell[1] += 1
                total += 1
                if progress is not None:
                    progress(total, n_all)
        finally:
            cap.release()
    ms = np.asarray(cpu) * 1000.0
    described_per_detection = (
        {}
        if encoder is None
        else {"descriptors": described, "descriptors_per_detection": described / max(1, detections)}
    )
    upper = [hits[bin_label(*b)] for b in HEIGHT_BINS[1:]]
    found_45, faces_45 = sum(c[0] for c in upper), sum(c[1] for c in upper)
    return {
        "frames": frames,
        "faces": {k: v[1] for k, v in hits.items()},
        "recall": {k: (v[0] / v[1] if v[1] else None) for k, v in hits.items()},
        "recall_45_up": found_45 / faces_45 if faces_45 else None,
        "false_detections": false,
        "false_per_1000_frames": 1000.0 * false / max(1, frames),
        "cpu_ms_per_frame": float(ms.mean()) if ms.size else None,
        "cpu_ms_per_frame_p95": float(np.percentile(ms, 95)) if ms.size else None,
        "frames_per_cpu_second": float(1000.0 / ms.mean()) if ms.size and ms.mean() > 0 else None,
        **({} if judge is None else {"tracks": {**judge.summary(), **described_per_detection}}),
    }


def evaluate_tracks(
    detector: Any,
    scenes: Sequence[str | Path],
    make_tracker: Callable[[], Any],
    encoder: Any = None,
) -> dict[str, Any]:
    """Track every scene with a fresh tracker; switches, fragments and mixed tracks against the passes.

    :func:`peep.lab.scenes.detectors.evaluate`'s ``tracks`` (one pass over the frames does both).

    Parameters
    ----------
    detector
        Has ``detect(image) -> list[FaceBox]``.
    scenes : sequence of path
        Scenes without suffix (``<scene>.mp4``, ``.gt.jsonl``).
    make_tracker : callable
        A new tracker per scene, with ``update(boxes, t, frame_shape) -> tracks`` (each with an ``id``).
    encoder : optional
        The descriptor encoder the tracker may compare faces with (``encode(image, box)``).
    """
    tracks: dict[str, Any] = evaluate(detector, scenes, make_tracker=make_tracker, encoder=encoder)["tracks"]
    return tracks
