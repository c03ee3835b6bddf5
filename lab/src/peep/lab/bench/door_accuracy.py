"""The door bench's people and its accuracy part: who is enrolled, which photos are claims, how many open.

A door deciding on the device (``door.decision = "device"``) opens when the signed device model's score of the
claimed subject on the face's clean projection exceeds the device's own threshold, set at the model's FAR
target (0.1 %) on the public calibration faces it carries. How often that lets an impostor in cannot be read
off 40 video claims: at 0.1 % it needs thousands. So the bench decides every held-out photo of every enrolled
person with **every** enrolled subject's badge — its own (a genuine claim) and each other's (an impostor claim)
— with the door's own decider exactly as a claim is decided (:func:`decide_photos`, run in the door's process:
the photo's largest face found by the door's detector, :meth:`peep.edge.pipeline.FramePipeline.project_face`,
:meth:`peep.edge.decide.DeviceDecider.verify` — the same projection, site-key rotation, model, threshold and
rule). No video is needed: a claim's frames only choose which face is projected.

The people (:func:`choose_enrolled`): the LFW people with the most photos, 20 enrolment photos each and up to 40
held out (a full run: 10 people, so each held-out photo makes 9 impostor claims — at least 3,000 in all); a
``--quick`` run takes 5 people with 6 held-out photos each and says it has fewer claims. The calibration people
(:func:`calibration_people`): every other public person with at least 5 photos who is neither enrolled nor in
the bundle's background class, at most 9 faces each (the device weighs every person the same). Nothing here
looks at a claim's outcome to choose anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: (people enrolled, enrolment photos each, most held-out photos each) of a full and of a --quick run.
FULL_SETUP = (10, 20, 40)
QUICK_SETUP = (5, 20, 6)
#: Impostor claims a full run must make: with none opened, the one-sided 95 % bound is then <= 0.1 %.
MIN_IMPOSTOR_CLAIMS = 3000
#: The door's targets when it decides on the device.
TARGET_IMPOSTOR_OPENED = 0.001
TARGET_GENUINE_OPENED = 0.95
#: Public people with at least this many photos may calibrate; at most this many faces of each are kept.
CALIBRATION_MIN_PHOTOS = 5
CALIBRATION_MAX_PER_PERSON = 9
#: A --quick run's calibration people (the first ones by name): it stays small.
QUICK_CALIBRATION_PEOPLE = 40


def choose_enrolled(people: Mapping[str, Sequence[Any]], quick: bool) -> tuple[list[str], int, int]:
    """The enrolled people (most photos first, ties by name), enrolment photos each, most held out each."""
    n, enrol, held = QUICK_SETUP if quick else FULL_SETUP
    fit = [name for name, photos in people.items() if len(photos) >= enrol + 6]
    fit.sort(key=lambda name: (-len(people[name]), name))
    if len(fit) < n:
        raise RuntimeError(f"the data home has {len(fit)} LFW people with {enrol + 6}+ photos; the bench needs {n}")
    return sorted(fit[:n]), enrol, held


def calibration_people(people: Mapping[str, Sequence[Any]], taken: set[str], quick: bool) -> list[str]:
    """Public people neither enrolled nor in the background (``taken``), by name; the first 40 in a --quick run."""
    out = sorted(n for n, p in people.items() if len(p) >= CALIBRATION_MIN_PHOTOS and n not in taken)
    return out[:QUICK_CALIBRATION_PEOPLE] if quick else out


def split_photos(dataset: Any, enrol: int) -> tuple[Any, list[tuple[str, Path]]]:
    """Each person's first ``enrol`` usable photos (file order) enrolled; the rest held out as ``(subject, path)``."""
    mask = np.zeros(dataset.n_images, dtype=bool)
    held: list[tuple[str, Path]] = []
    for label in np.unique(dataset.labels):
        idx = np.flatnonzero(dataset.labels == label)
        mask[idx[:enrol]] = True
        subject = str(dataset.target_names[label]).replace(" ", "_")
        held += [(subject, Path(dataset.paths[i])) for i in idx[enrol:]]
    return mask, held


def write_bench_calibration(bundle: Any, path: Path, *, mechanism: str, people: Sequence[str],
                            exclude: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    """The device models' calibration file: clean, unkeyed projections of ``people`` by ``bundle`` into the domain
    of ``mechanism``, as a device projects (:func:`peep.server.bundles.calibrate.make_calibration`); what the
    section reports about it."""
    from peep.server.bundles.calibrate import make_calibration, write_calibration

    proj, tags, domain, kind = make_calibration(bundle, "lfw", mechanism=mechanism, people=people, exclude=exclude,
                                                max_per_person=CALIBRATION_MAX_PER_PERSON)  # fmt: skip
    cal = write_calibration(path, projections=proj, people=tags, bundle_id=bundle.bundle_id, domain=domain,
                            mechanism=kind)  # fmt: skip
    return {"people": cal.n_people, "faces": cal.n_faces, "max_per_person": CALIBRATION_MAX_PER_PERSON}


def decide_photos(pipeline: Any, decider: Any, photos: Sequence[tuple[str, str]], subjects: Sequence[str]
                  ) -> dict[str, Any]:  # fmt: skip
    """Every photo claimed with every subject's badge, decided as the door decides a claim (in the door's process).

    Parameters
    ----------
    pipeline : FramePipeline
        The door agent's open pipeline (its detector, descriptor and bundle).
    decider : DeviceDecider
        The door's decider of the model it fetched (its site key, thresholds and rule).
    photos : sequence of (subject, path)
        Held-out photos of enrolled subjects.
    subjects : sequence of str
        Every enrolled subject: the badges each photo is claimed with.

    Returns
    -------
    dict
        ``genuine`` and ``impostor`` claims and how many opened, photos without a face (no claim made: a door
        seeing no face refuses ``no_face``), per subject genuine counts, and score quantiles.
    """
    import cv2
    from peep.core.imaging import primary_face
    from peep.edge.capture import Frame

    genuine = genuine_opened = impostor = impostor_opened = 0
    no_face: list[str] = []
    by_subject: dict[str, list[int]] = {s: [0, 0] for s in subjects}
    opened_pairs: dict[str, int] = {}
    g_scores: list[float] = []
    i_scores: list[float] = []
    for i, (subject, path) in enumerate(photos):
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        box = None if image is None else primary_face(pipeline.detector.detect(image), image.shape)
        if image is None or box is None:
            no_face.append(Path(path).name)
            continue
        frame = Frame(image=np.ascontiguousarray(image, dtype=np.uint8), timestamp=float(i), index=i)
        projection = pipeline.project_face(frame, box)
        for claimed in subjects:
            verdict = decider.verify(projection[None, :], claimed)
            if claimed == subject:
                genuine += 1
                genuine_opened += verdict.accepted
                by_subject[subject][0] += 1
                by_subject[subject][1] += verdict.accepted
                g_scores.append(verdict.score)
            else:
                impostor += 1
                impostor_opened += verdict.accepted
                i_scores.append(verdict.score)
                if verdict.accepted:
                    pair = f"{subject} as {claimed}"
                    opened_pairs[pair] = opened_pairs.get(pair, 0) + 1
    return {
        "photos": len(photos),
        "no_face": len(no_face),
        "genuine_claims": genuine,
        "genuine_opened": genuine_opened,
        "impostor_claims": impostor,
        "impostor_opened": impostor_opened,
        "impostor_opened_as": opened_pairs,
        "genuine_by_subject": {s: {"claims": c, "opened": o} for s, (c, o) in by_subject.items()},
        "threshold": float(decider.thresholds.verify_threshold),
        "genuine_score_quantiles": _quantiles(g_scores),
        "impostor_score_quantiles": _quantiles(i_scores),
    }


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    q = np.quantile(np.asarray(values, dtype=float), [0.05, 0.5, 0.95, 0.999])
    return {"p5": float(q[0]), "p50": float(q[1]), "p95": float(q[2]), "p99_9": float(q[3]), "max": max(values)}


def rate_upper95(k: int, n: int) -> float:
    """One-sided 95 % Clopper-Pearson upper bound of a rate observed as ``k`` of ``n``."""
    from scipy.stats import beta

    if n == 0 or k >= n:
        return 1.0
    return float(beta.ppf(0.95, k + 1, n - k))


def rate_interval95(k: int, n: int) -> tuple[float, float]:
    """Two-sided 95 % Clopper-Pearson interval of a rate observed as ``k`` of ``n``."""
    from scipy.stats import beta

    if n == 0:
        return 0.0, 1.0
    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k >= n else float(beta.ppf(0.975, k + 1, n - k))
    return lo, hi


def summarise(raw: Mapping[str, Any], model: Mapping[str, Any], quick: bool) -> dict[str, Any]:
    """The section's ``accuracy`` of one bundle: counts, rates and bounds, the threshold, and the targets."""
    n_i, k_i = int(raw["impostor_claims"]), int(raw["impostor_opened"])
    n_g, k_g = int(raw["genuine_claims"]), int(raw["genuine_opened"])
    i_rate = k_i / n_i if n_i else math.nan
    g_rate = k_g / n_g if n_g else math.nan
    g_lo, g_hi = rate_interval95(k_g, n_g)
    out: dict[str, Any] = {
        **dict(raw),
        "impostor_opened_rate": i_rate,
        "impostor_opened_upper95": rate_upper95(k_i, n_i),
        "genuine_opened_rate": g_rate,
        "genuine_opened_interval95": [g_lo, g_hi],
        "far_target": model.get("far_target"),
        "far_public": model.get("far_public"),
        "target_impostor_opened": TARGET_IMPOSTOR_OPENED,
        "target_genuine_opened": TARGET_GENUINE_OPENED,
        # Met as observed; and whether the claims made show it at 95 % confidence.
        "impostor_target_met": bool(n_i) and i_rate <= TARGET_IMPOSTOR_OPENED,
        "impostor_target_met_at_95": bool(n_i) and rate_upper95(k_i, n_i) <= TARGET_IMPOSTOR_OPENED,
        "genuine_target_met": bool(n_g) and g_rate >= TARGET_GENUINE_OPENED,
        "min_impostor_claims": MIN_IMPOSTOR_CLAIMS,
        "enough_impostor_claims": n_i >= MIN_IMPOSTOR_CLAIMS,
    }
    if quick:
        out["note"] = (
            f"--quick: {QUICK_SETUP[0]} people, at most {QUICK_SETUP[2]} held-out photos each, so far fewer than the "
            f"{MIN_IMPOSTOR_CLAIMS} impostor claims of a full run: the rates are not resolved"
        )
    return out
