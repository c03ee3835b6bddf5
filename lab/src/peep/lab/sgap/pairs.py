"""Face pairs for SGAP's Siamese discriminator: half the same person, half different (numpy only).

Training draws them (:mod:`peep.lab.sgap.train`, torch); the evaluation
draws them too, for the paper's own protocol on the evaluated people
(:meth:`peep.lab.anonymize.methods.SGAP.own_protocol`, no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass
class Pairs:
    """Face pairs by index: ``a[i]`` and ``b[i]``, ``different[i]`` = 1.0 if they are different people."""

    a: NDArray[np.int64]
    b: NDArray[np.int64]
    different: NDArray[np.float32]


def split_identities(
    labels: NDArray[np.int64], val_fraction: float, rng: np.random.Generator
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Masks (train, held-out) over images splitting whole identities, at least 2 on each side."""
    people = np.unique(labels)
    if people.size < 4:
        raise ValueError(f"faces: expected at least 4 people (2 to train, 2 held out), received {people.size}")
    n_val = min(max(2, round(val_fraction * people.size)), people.size - 2)
    held = rng.choice(people, size=n_val, replace=False)
    val = np.isin(labels, held)
    return ~val, val


def sample_pairs(
    anchors: NDArray[np.int64],
    labels: NDArray[np.int64],
    rng: np.random.Generator,
    pool: NDArray[np.int64] | None = None,
) -> Pairs:
    """One pair per anchor: half with another photo of the same person, half with a different person.

    Parameters
    ----------
    anchors : ndarray of shape (n,)
        Indices into ``labels``.
    labels : ndarray of shape (n_images,)
    pool : ndarray, optional
        Indices partners are drawn from (default: the anchors); every anchor's
        person must have another image in it.
    """
    pool = np.unique(anchors if pool is None else pool)
    by_person: dict[int, NDArray[np.int64]] = {}
    pool_labels = labels[pool]
    for p in np.unique(pool_labels):
        by_person[int(p)] = pool[pool_labels == p]
    n = anchors.size
    different = np.zeros(n, dtype=np.float32)
    different[rng.permutation(n)[: n // 2]] = 1.0
    partners = np.empty(n, dtype=np.int64)
    for i, (a, diff) in enumerate(zip(anchors, different, strict=True)):
        mine = int(labels[a])
        if diff:
            while True:
                j = int(pool[rng.integers(pool.size)])
                if labels[j] != mine:
                    break
        else:
            others = by_person[mine][by_person[mine] != a]
            j = int(others[rng.integers(others.size)])
        partners[i] = j
    return Pairs(a=anchors.astype(np.int64), b=partners, different=different)
