"""Track fusion: one decision from the releases of one track.

A device may release a track more than once (its per-track budget allows
it: the demo's 36 per-vector ε is two releases of 18). Each release is an
independent noisy view of the same face, so the server can decide on the
track from all of them -- post-processing of what was already released,
which spends no further ε. With class posteriors ``P(c | x_i)`` of a model
trained with class frequencies ``π_c``, and the releases independent given
the person (the mechanism draws fresh noise for each),

    P(c | x_1 … x_n) ∝ Π_i P(c | x_i) / π_c^(n−1)            (the product rule)

A fused posterior is sharper than a single one, so it gets its own
unknown threshold, calibrated like the single one on held-out background
people, with pairs of their templates fused (:func:`fused_background_scores`;
``unknown_threshold_fused`` in the model's metadata). A model without it
(trained before fusion existed, or with too few background pairs) never
fuses.

:class:`TrackFusion` keeps, per (site, device, track), the posterior of the
track's last release under one model version, so a decision uses the
track's last two releases (the calibration is for pairs); bounded in
tracks, forgotten ``ttl_s`` after the track's last release (a running
server sweeps it every second, :meth:`TrackFusion.expire`, so nothing of a
track outlives its window by more than that). Replicas do not share this
memory: on PostgreSQL each identify release of a track is also remembered
in the database's ``track_memory`` until the same expiry, and a replica
that does not remember a track recalls its earlier release from there
(:meth:`Recogniser.identify_tracks`' ``recall``). Neither is ever in
``templates``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["TrackFusion"]

_FLOOR = 1e-300


def fuse_posteriors(P: NDArray[np.floating[Any]], priors: NDArray[np.floating[Any]]) -> NDArray[np.float64]:
    """The product rule: one posterior from the posteriors of independent releases of one face.

    Parameters
    ----------
    P : ndarray of shape (n_releases, n_classes)
        Each release's class posteriors (rows sum to 1; zeros allowed, e.g. an erased subject).
    priors : ndarray of shape (n_classes,)
        The class frequencies the model was trained with (all > 0).

    Returns
    -------
    ndarray of shape (n_classes,)
        ``∝ Π_i P[i] / priors^(n−1)``, normalised; a single row comes back unchanged.
    """
    rows: NDArray[np.float64] = np.atleast_2d(np.asarray(P, dtype=np.float64))
    if rows.ndim != 2:
        raise ValueError(f"P: expected shape (n, k), received {rows.shape}")
    if rows.shape[0] == 1:
        _check_priors(priors, rows.shape[1])
        out: NDArray[np.float64] = rows[0].copy()
    else:
        out = _product(rows[None], priors)[0]
    return out


def fuse_pairs(
    A: NDArray[np.floating[Any]], B: NDArray[np.floating[Any]], priors: NDArray[np.floating[Any]]
) -> NDArray[np.float64]:
    """:func:`fuse_posteriors` of each pair ``(A[i], B[i])`` at once (the ingest path's batches).

    Parameters
    ----------
    A, B : ndarray of shape (n, n_classes)
    priors : ndarray of shape (n_classes,)

    Returns
    -------
    ndarray of shape (n, n_classes)
    """
    return _product(np.stack([np.asarray(A, np.float64), np.asarray(B, np.float64)], axis=1), priors)


def _check_priors(priors: NDArray[np.floating[Any]], k: int) -> NDArray[np.float64]:
    pri = np.asarray(priors, dtype=np.float64)
    if pri.shape != (k,):
        raise ValueError(f"P, priors: expected shapes (n, {k}) and ({k},), received priors {pri.shape}")
    if not np.all(pri > 0):
        raise ValueError("priors: expected every class frequency > 0")
    return pri


def _product(P: NDArray[np.float64], priors: NDArray[np.floating[Any]]) -> NDArray[np.float64]:
    """The product rule on P of shape (n_decisions, n_releases, n_classes), normalised per decision."""
    pri = _check_priors(priors, P.shape[2])
    s = np.log(np.maximum(P, _FLOOR)).sum(axis=1) - (P.shape[1] - 1) * np.log(pri)
    s[np.all(P <= 0.0, axis=1)] = -np.inf  # a class zeroed in every release stays zero (erasure)
    top = s.max(axis=1, keepdims=True)
    out: NDArray[np.float64] = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = out.sum(axis=1, keepdims=True)
    np.divide(out, total, out=out, where=total > 0)
    return out


def fused_background_scores(
    P: NDArray[np.floating[Any]],
    groups: Sequence[str] | NDArray[Any],
    known: NDArray[np.intp],
    priors: NDArray[np.floating[Any]],
    rng: np.random.Generator,
) -> NDArray[np.float64]:
    """Best enrolled probability of fused pairs of held-out background templates of the same person.

    What a stranger's two-release track scores: each background person's
    templates are shuffled and taken two at a time (disjoint pairs).

    Parameters
    ----------
    P : ndarray of shape (n_templates, n_classes)
        Out-of-sample posteriors of background templates.
    groups : sequence of str, length n_templates
        The background person of each template.
    known : ndarray
        Indices of the enrolled classes.

    Returns
    -------
    ndarray of shape (n_pairs,)
    """
    g = np.asarray(list(groups), dtype=object)
    a_rows: list[int] = []
    b_rows: list[int] = []
    for person in sorted(set(g.tolist())):
        rows = rng.permutation(np.flatnonzero(g == person))
        a_rows += rows[0::2][: rows.size // 2].tolist()
        b_rows += rows[1::2][: rows.size // 2].tolist()
    if not a_rows:
        return np.zeros(0, dtype=np.float64)
    P = np.asarray(P, dtype=np.float64)
    fused = fuse_pairs(P[a_rows], P[b_rows], priors)
    return np.asarray(fused[:, known].max(axis=1), dtype=np.float64)


@dataclass
class _Track:
    version: str
    row: NDArray[np.float64]
    seen: float
    release: str | None = None


class TrackFusion:
    """The recent releases of each track, for fused decisions (thread-safe, bounded).

    Parameters
    ----------
    ttl_s : float
        A track with no release for this long is forgotten (its next release starts afresh).
    max_tracks : int
        Tracks kept at most; the least recently seen go first.
    clock : callable, optional
        Monotonic seconds (injected for tests).
    """

    def __init__(
        self, *, ttl_s: float = 30.0, max_tracks: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s: expected a number > 0, received {ttl_s}")
        if max_tracks < 1:
            raise ValueError(f"max_tracks: expected >= 1, received {max_tracks}")
        self.ttl_s = ttl_s
        self.max_tracks = max_tracks
        self._clock = clock
        self._tracks: OrderedDict[tuple[str, str, str], _Track] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tracks)

    def add(
        self,
        key: tuple[str, str, str],
        version: str,
        posterior: NDArray[np.floating[Any]],
        *,
        release: str | None = None,
    ) -> NDArray[np.float64] | None:
        """Record one release's posterior; returns the track's previous release's posterior, to fuse with.

        None for a track's first release (or its first under a new model version, or after ``ttl_s``),
        and when the previous release is this one (``release``, its message id, seen again: a batch
        that failed to commit and came back).
        """
        now = self._clock()
        row = np.array(posterior, dtype=np.float64)  # a copy: the caller may overwrite its array
        with self._lock:
            self._expire(now, room=1)
            t = self._tracks.pop(key, None)
            previous = None
            if (
                t is not None
                and t.version == version
                and now - t.seen <= self.ttl_s
                and t.row.shape == row.shape
                and (release is None or t.release != release)
            ):
                previous = t.row
            self._tracks[key] = _Track(version=version, row=row, seen=now, release=release)  # most recent last
            return previous

    def expire(self) -> int:
        """Forget every track whose last release is more than ``ttl_s`` old; returns how many were forgotten."""
        with self._lock:
            return self._expire(self._clock(), room=0)

    def _expire(self, now: float, *, room: int) -> int:
        # Oldest first (the dict is in order of last release): stop at the first one still in its window,
        # once there is room for ``room`` more.
        n = 0
        while self._tracks:
            oldest_key, oldest = next(iter(self._tracks.items()))
            if now - oldest.seen <= self.ttl_s and len(self._tracks) + room <= self.max_tracks:
                break
            del self._tracks[oldest_key]
            n += 1
        return n
