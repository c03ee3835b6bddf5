"""Identification of releases where a track's releases are decided together: the fusion memory's owner.

Ingest hands over the identify templates of a batch; what a track remembers, for how long, and how a replica
that did not see a track's earlier release finds it in the shared ``track_memory`` is decided here, with the
model (:mod:`peep.server.recognition.fusion` for the rule and its thresholds). Ingest writes what this says to
remember (:meth:`TrackIdentifier.memory_rows`) in its batch's transaction, so a remembered release is never
ahead of the ledger that counts it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray
from peep.server.recognition.fusion import TrackFusion
from peep.server.recognition.recogniser import Identification, LoadedModel, Recogniser
from peep.server.storage import TrackRelease
from peep.v1 import template_pb2

__all__ = ["TrackIdentifier"]

log = logging.getLogger(__name__)


class TrackMemory(Protocol):
    """The shared memory of tracks' releases (the store's ``track_memory`` table, on replicas)."""

    def track_memory(self, tracks: Sequence[tuple[str, str]], *, now: float) -> list[TrackRelease]: ...

    def expire_track_memory(self, now: float) -> int: ...


def _capture_time(m: template_pb2.PerturbedTemplate) -> float:
    return m.capture_time.seconds + m.capture_time.nanos * 1e-9


class TrackIdentifier:
    """Identify templates, fusing each with its track's previous release where the model allows.

    Parameters
    ----------
    recogniser : Recogniser
    fusion : TrackFusion or None
        This process's memory of recent releases per track; None: every release is decided alone.
    memory : TrackMemory or None
        Replicas share the database but not their memory: each identify release of a track is also remembered
        there (for the fusion window only) and a track this process does not remember is looked up there.
        None for a single server, whose own memory is complete.
    clock : callable
        Unix time (injected for tests), for the shared memory's expiry.
    """

    def __init__(
        self,
        recogniser: Recogniser,
        fusion: TrackFusion | None,
        *,
        memory: TrackMemory | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.recogniser = recogniser
        self.fusion = fusion
        self.memory = memory
        self.clock = clock

    @property
    def fuses(self) -> bool:
        """Whether a track's releases are decided together (a fusion window is configured)."""
        return self.fusion is not None

    @property
    def shared(self) -> bool:
        """Whether releases are also remembered in the shared memory (replicas)."""
        return self.fusion is not None and self.memory is not None

    def identify(
        self, values: NDArray[np.floating[Any]], msgs: Sequence[template_pb2.PerturbedTemplate], model: LoadedModel
    ) -> list[Identification]:
        """Identify each row of ``values`` (shape (n, n_components)), the values of ``msgs[i]``, with ``model``.

        A template without a track id is decided alone; a release is never fused with itself (a batch that
        failed to commit and came back is told by its message ids).
        """
        if self.fusion is None:
            return self.recogniser.identify_batch(values, top_k=1, model=model)
        keys = [(m.site, m.device_id, m.track_id) if m.track_id else None for m in msgs]
        recall = self._recaller(list(msgs), model.n_components) if self.shared else None
        return self.recogniser.identify_tracks(
            values, keys, self.fusion, model=model, recall=recall, releases=[m.message_id for m in msgs]
        )

    def memory_rows(
        self, msgs: Sequence[template_pb2.PerturbedTemplate], values: Sequence[NDArray[np.floating[Any]]], now: float
    ) -> list[TrackRelease]:
        """What to remember in the shared memory of these identify releases (none for a single server).

        Parameters
        ----------
        msgs : sequence of n PerturbedTemplate
            New identify releases (a device's own decision carries no template and is not passed).
        values : sequence of n ndarray of shape (n_components,)
        now : float
            Unix time of the batch: each row expires with the fusion window from it.
        """
        if not self.shared:
            return []
        assert self.fusion is not None
        return [
            TrackRelease(
                device_id=m.device_id,
                track_id=m.track_id,
                message_id=m.message_id,
                site=m.site,
                bundle_id=m.bundle_id,
                capture_time=_capture_time(m),
                expires_at=now + self.fusion.ttl_s,
                n_components=int(v.shape[0]),
                values=np.ascontiguousarray(v, dtype="<f4").tobytes(),
            )
            for m, v in zip(msgs, values, strict=True)
            if m.track_id
        ]

    def expire(self, *, now: float | None = None) -> int:
        """Forget expired releases, in this process and (replicas) in the shared memory; returns how many."""
        n = self.fusion.expire() if self.fusion is not None else 0
        if self.shared:
            assert self.memory is not None
            n += self.memory.expire_track_memory(self.clock() if now is None else now)
        return n

    def _recaller(
        self, msgs: list[template_pb2.PerturbedTemplate], n_components: int
    ) -> Callable[[list[int]], dict[int, NDArray[np.float32]]]:
        """``recall(rows)``: for each row, the values of its track's latest earlier release in the shared memory."""
        memory = self.memory
        assert memory is not None

        def recall(rows: list[int]) -> dict[int, NDArray[np.float32]]:
            asked = [msgs[i] for i in rows]
            batch = {(m.device_id, m.message_id) for m in msgs}
            try:
                found = memory.track_memory([(m.device_id, m.track_id) for m in asked], now=self.clock())
            except Exception as exc:  # the database: decide on each release alone rather than fail it
                log.warning("track recall failed; deciding alone", extra={"error": str(exc)[:200]})
                return {}
            by_track: dict[tuple[str, str], list[TrackRelease]] = {}
            for r in found:
                by_track.setdefault((r.device_id, r.track_id), []).append(r)
            out: dict[int, NDArray[np.float32]] = {}
            for i, m in zip(rows, asked, strict=True):
                at = _capture_time(m)
                earlier = [
                    r
                    for r in by_track.get((m.device_id, m.track_id), [])
                    if r.key not in batch and r.site == m.site and r.bundle_id == m.bundle_id
                    and r.n_components == n_components and r.capture_time < at
                ]  # fmt: skip
                if earlier:
                    out[i] = max(earlier, key=lambda r: r.capture_time).as_array()
            return out

        return recall
