"""The maths of every anonymiser, as pure functions on numpy arrays.

Nothing here keeps state, reads files or draws randomness it was not given:
the classes in :mod:`peep.lab.anonymize.methods` validate parameters and
hold fitted state, and call these.

UPBA (Moriarty et al., "Utility-Preserving Biometric Information Anonymization", Algorithm 1)
    For each record ``d``: a random set ``F`` of ``g`` records containing
    ``d`` whose attribute purity is ``t`` (``round(t·g)`` members, ``d``
    included, share ``d``'s value of the attribute of interest; the others
    do not) — :func:`upba_random_sets`; the indicator ``X_I`` of the features
    a random forest finds most important for the attribute of interest (top
    ``r_p``) and for each additional attribute (top ``r_q``) —
    :func:`retention_mask`; and ``d' = mean(F)/w + ((w−1)/w)·(X_I ⊙ d)`` —
    :func:`upba_mix`.

Baselines
    Gaussian blur (:func:`gaussian_blur`), pixelation (:func:`pixelate`),
    k-Same-Pixel (Newton, Sweeney & Malin 2005; :func:`k_same_groups`,
    :func:`k_same_pixel`) and differentially private pixelisation (Fan 2018,
    "Image pixelization with differential privacy"; :func:`dp_pixelate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import cv2
import numpy as np
from numpy.typing import NDArray
from scipy.spatial.distance import cdist

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


# --------------------------------------------------------------------------- UPBA


def purity_counts(g: int, t: float) -> tuple[int, int]:
    """Members of ``F`` sharing ``d``'s attribute value (``d`` included) and members that do not.

    ``round(t·g)``, at least 1 (``d`` itself): ``t = 1/g`` means only ``d``
    shares its value, ``t = 1`` means every member does.

    >>> purity_counts(32, 0.6)
    (19, 13)
    """
    same = max(1, min(g, math.floor(t * g + 0.5)))
    return same, g - same


def upba_random_sets(
    pool_attribute: NDArray[np.int64],
    record_attribute: NDArray[np.int64],
    *,
    g: int,
    t: float,
    rng: np.random.Generator,
    self_index: NDArray[np.int64] | None = None,
) -> IntArray:
    """The other ``g − 1`` members of each record's random set ``F`` (indices into the pool).

    Parameters
    ----------
    pool_attribute : ndarray of shape (n_pool,)
        Attribute value of each record ``F`` is drawn from.
    record_attribute : ndarray of shape (n_records,)
        Attribute value of each record ``d`` being anonymised.
    g : int
        Size of ``F``, ``d`` included.
    t : float
        Attribute purity of ``F`` in [1/g, 1].
    rng : numpy Generator
    self_index : ndarray of shape (n_records,), optional
        Pool index of each record (``-1``: not in the pool), so that ``d`` is
        not drawn a second time.

    Returns
    -------
    ndarray of shape (n_records, g - 1)
        ``same − 1`` members with ``d``'s value first, then ``g − same``
        members with another value (:func:`purity_counts`), each drawn without
        replacement.
    """
    same, other = purity_counts(g, t)
    pool_attribute = np.asarray(pool_attribute, dtype=np.int64)
    record_attribute = np.asarray(record_attribute, dtype=np.int64)
    n = record_attribute.shape[0]
    own = np.full(n, -1, dtype=np.int64) if self_index is None else np.asarray(self_index, dtype=np.int64)
    by_value = {int(v): np.flatnonzero(pool_attribute == v) for v in np.unique(pool_attribute)}
    out = np.empty((n, g - 1), dtype=np.int64)
    for i in range(n):
        a = int(record_attribute[i])
        alike = by_value.get(a, np.zeros(0, dtype=np.int64))
        if own[i] >= 0:
            alike = alike[alike != own[i]]
        unlike = np.flatnonzero(pool_attribute != a)
        if alike.size < same - 1 or unlike.size < other:
            raise ValueError(
                f"g: expected a set size the data can fill at purity t = {t:g} ({same - 1} other records with "
                f"value {a} and {other} with another value), received g = {g} with {alike.size} and "
                f"{unlike.size} available"
            )
        out[i, : same - 1] = rng.choice(alike, size=same - 1, replace=False)
        out[i, same - 1 :] = rng.choice(unlike, size=other, replace=False)
    return out


def set_means(records: FloatArray, pool: FloatArray, members: IntArray) -> FloatArray:
    """``mean(F)`` of each record: the record and its ``g − 1`` members, shape (n_records, n_features)."""
    g = members.shape[1] + 1
    total = np.asarray(records, dtype=np.float64).copy()
    for j in range(members.shape[1]):  # a loop over g keeps memory at n × p, not n × g × p
        total += pool[members[:, j]]
    out: FloatArray = total / g
    return out


def retention_mask(importances: Sequence[FloatArray], ratios: Sequence[float]) -> NDArray[np.bool_]:
    """``X_I``: the union of each attribute's top features by importance.

    Parameters
    ----------
    importances : sequence of ndarray of shape (n_features,)
        Feature importances of a classifier of each attribute (the attribute
        of interest first).
    ratios : sequence of float
        Fraction of features retained for each (``r_p``, then ``r_q`` per
        additional attribute); ``ceil(r·n_features)`` of them, none for 0.

    Returns
    -------
    ndarray of shape (n_features,), bool
    """
    if len(importances) != len(ratios):
        raise ValueError(f"ratios: expected one per importance vector ({len(importances)}), received {len(ratios)}")
    n = int(np.asarray(importances[0]).shape[0])
    mask = np.zeros(n, dtype=bool)
    for imp, r in zip(importances, ratios, strict=True):
        k = math.ceil(r * n - 1e-9)
        if k > 0:
            mask[np.argsort(-np.asarray(imp), kind="stable")[:k]] = True
    return mask


def upba_mix(records: FloatArray, means: FloatArray, mask: NDArray[np.bool_], w: float) -> FloatArray:
    """``d' = mean(F)/w + ((w − 1)/w)·(X_I ⊙ d)`` for every record (Algorithm 1's output).

    Parameters
    ----------
    records : ndarray of shape (n_records, n_features)
    means : ndarray of shape (n_records, n_features)
        ``mean(F)`` of each record (:func:`set_means`).
    mask : ndarray of shape (n_features,), bool
        ``X_I`` (:func:`retention_mask`).
    w : float
        Weight ``w >= 1``.

    >>> upba_mix(np.array([[2.0, 4.0]]), np.array([[1.0, 1.0]]), np.array([True, False]), 2.0)
    array([[1.5, 0.5]])
    """
    out: FloatArray = means / w + ((w - 1.0) / w) * (np.asarray(records, dtype=np.float64) * mask)
    return out


# --------------------------------------------------------------------------- baselines


def gaussian_blur(images: NDArray[np.floating], sigma: float) -> FloatArray:
    """Each image convolved with a Gaussian of standard deviation ``sigma`` pixels, shape (n, h, w).

    The kernel spans ±3σ (OpenCV's size for ``ksize = 0`` rounds it); borders reflect.
    """
    imgs = np.asarray(images, dtype=np.float64)
    out = np.empty_like(imgs)
    for i in range(imgs.shape[0]):
        out[i] = cv2.GaussianBlur(imgs[i], (0, 0), sigmaX=float(sigma), sigmaY=float(sigma))
    return out


def _cells(shape: tuple[int, int], block: int) -> tuple[IntArray, IntArray, int, int]:
    h, w = shape
    rows = np.arange(h) // block
    cols = np.arange(w) // block
    return rows, cols, int(rows[-1]) + 1, int(cols[-1]) + 1


def cell_means(images: NDArray[np.floating], block: int) -> tuple[FloatArray, FloatArray]:
    """Mean of each ``block × block`` cell (edge cells smaller) and the pixel count of each cell.

    Returns
    -------
    means : ndarray of shape (n, ceil(h / block), ceil(w / block))
    counts : ndarray of shape (ceil(h / block), ceil(w / block))
    """
    imgs = np.asarray(images, dtype=np.float64)
    n, h, w = imgs.shape
    nr, nc = -(-h // block), -(-w // block)
    padded = np.zeros((n, nr * block, nc * block))
    padded[:, :h, :w] = imgs
    cell = padded.reshape(n, nr, block, nc, block).sum(axis=(2, 4))
    inside = np.zeros((nr * block, nc * block))
    inside[:h, :w] = 1.0
    counts = inside.reshape(nr, block, nc, block).sum(axis=(1, 3))
    out: FloatArray = cell / counts
    return out, counts


def expand_cells(cells: FloatArray, shape: tuple[int, int], block: int) -> FloatArray:
    """Each cell's value written to all its pixels: (n, cells_h, cells_w) → (n, h, w)."""
    rows, cols, _, _ = _cells(shape, block)
    out: FloatArray = cells[:, rows][:, :, cols]
    return out


def pixelate(images: NDArray[np.floating], block: int) -> FloatArray:
    """Every ``block × block`` cell replaced by its mean, shape (n, h, w)."""
    imgs = np.asarray(images, dtype=np.float64)
    means, _ = cell_means(imgs, block)
    return expand_cells(means, (imgs.shape[1], imgs.shape[2]), block)


def dp_pixelate(
    images: NDArray[np.floating],
    *,
    block: int,
    m: int,
    noise: Callable[[FloatArray, float], FloatArray],
) -> FloatArray:
    """Fan's DP-Pix: pixelate, then add Laplace noise of sensitivity ``m / |cell|`` to each cell mean.

    Two images are neighbours when they differ in at most ``m`` pixels; a
    pixel lies in [0, 1], so a cell mean over ``|cell|`` pixels moves by at
    most ``m/|cell|`` and the whole cell grid by at most that in L1 (the
    differing pixels may all fall in one cell). Laplace noise of scale
    ``m/(|cell|·ε)`` on every cell makes the image ε-DP for m-neighbours
    (Fan 2018, Theorem 1; interior cells have ``|cell| = block²``).

    Parameters
    ----------
    images : ndarray of shape (n, h, w), values in [0, 1]
    block : int
    m : int
    noise : callable ``(values, sensitivity) -> noisy values``
        Adds ε-calibrated Laplace noise of the given L1 sensitivity
        (a :class:`peep.core.mechanisms.LaplaceMechanism` per cell size).

    Returns
    -------
    ndarray of shape (n, h, w)
        Not clipped (clipping for display is post-processing).
    """
    imgs = np.asarray(images, dtype=np.float64)
    means, counts = cell_means(imgs, block)
    noisy = means.copy()
    for size in np.unique(counts):
        where = counts == size
        noisy[:, where] = noise(means[:, where], m / float(size))
    return expand_cells(noisy, (imgs.shape[1], imgs.shape[2]), block)


def k_same_groups(flat: FloatArray, k: int, order: IntArray) -> IntArray:
    """k-Same's partition: each group is a face and its ``k − 1`` nearest remaining faces.

    Faces are visited in ``order``; the first face still unassigned takes the
    ``k`` nearest unassigned faces (Euclidean, itself included). When fewer
    than ``2k`` remain they form the last group, so every group has at least
    ``k`` members (Newton, Sweeney & Malin 2005, Fig. 3).

    Parameters
    ----------
    flat : ndarray of shape (n, n_features)
    k : int
        ``2 <= k <= n``.
    order : ndarray of shape (n,)
        A permutation of ``range(n)``.

    Returns
    -------
    ndarray of shape (n,)
        Group index of every face.
    """
    n = flat.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"k: expected 1 <= k <= the number of faces ({n}), received {k}")
    D = cdist(flat, flat, "sqeuclidean")
    group = np.full(n, -1, dtype=np.int64)
    remaining = np.ones(n, dtype=bool)
    g = 0
    for i in order:
        if not remaining[i]:
            continue
        left = np.flatnonzero(remaining)
        if left.size < 2 * k:
            group[left] = g
            break
        near = left[np.argsort(D[i, left], kind="stable")[:k]]
        group[near] = g
        remaining[near] = False
        g += 1
    return group


def k_same_pixel(flat: FloatArray, groups: IntArray) -> FloatArray:
    """Every face replaced by its group's pixel-wise mean, shape (n, n_features)."""
    n_groups = int(groups.max()) + 1
    sums = np.zeros((n_groups, flat.shape[1]))
    np.add.at(sums, groups, flat)
    out: FloatArray = (sums / np.bincount(groups, minlength=n_groups)[:, None])[groups]
    return out
