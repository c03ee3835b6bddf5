"""Follow ``StreamEvents`` across lost streams: the client side of resuming by ``seq``.

Behind a balancer a stream lives on one replica; when that replica goes, the
stream ends (``UNAVAILABLE``, or ``INTERNAL`` when the balancer resets it).
:class:`EventFollower` calls again — the balancer picks a live replica — with
``after_seq`` = the last seq it handed out, so its caller receives every kept
event once and in order across any number of lost streams. Errors that a new
call would only repeat (credentials, permissions, a bad request, a seq the
server never gave) are raised.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from peep.server.ingest.events import OLDEST_SEQ_KEY
from peep.v1 import recognition_pb2

__all__ = ["EventFollower"]

log = logging.getLogger(__name__)

#: Status codes a new call may not get: raised to the caller.
FATAL = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class EventFollower:
    """Iterate over recognition events, calling ``StreamEvents`` again after a lost stream.

    Parameters
    ----------
    stub : callable returning a ``RecognitionServiceStub``
        Called for each new stream (the same channel is fine: gRPC reconnects it).
    site : str
        The site whose events to follow ("" = every site the credential may see).
    metadata : sequence of (key, value)
        The call's credentials (``authorization: Bearer <token>``), if any.
    after_seq : int
        Start after this seq (0: from now on).
    backoff : (float, float)
        First and longest wait between calls (s), doubled after each call that failed at once.
    on_lost : callable, optional
        ``on_lost(status code name, details)`` each time a stream is lost, before calling again.
    on_gap : callable, optional
        ``on_gap(last seq, oldest kept seq)`` when a resumed stream says the server no longer keeps every event
        after the last seq (deleted by ``recognition.events_days`` or an erasure): some may be missing.
    """

    def __init__(
        self,
        stub: Callable[[], Any],
        *,
        site: str = "",
        metadata: Sequence[tuple[str, str]] = (),
        after_seq: int = 0,
        backoff: tuple[float, float] = (0.2, 5.0),
        on_lost: Callable[[str, str], None] | None = None,
        on_gap: Callable[[int, int], None] | None = None,
    ) -> None:
        if after_seq < 0:
            raise ValueError(f"after_seq: expected a seq >= 0, received {after_seq!r}")
        self._stub = stub
        self.site = site
        self.metadata = tuple(metadata)
        #: The seq of the last event handed out: where a new stream starts after.
        self.last_seq = int(after_seq)
        self._backoff = backoff
        self._on_lost = on_lost
        self._on_gap = on_gap
        #: (last seq, oldest kept seq) of each resume past what the server still keeps.
        self.gaps: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._call: Any = None
        #: Streams opened again after one was lost.
        self.reconnects = 0
        #: Events a server sent at or below the last seq handed out (dropped here; 0 from a correct server).
        self.repeated = 0

    def stop(self) -> None:
        """End the iteration (from another thread)."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()

    def _check_kept(self, metadata: Sequence[tuple[str, Any]] | None) -> None:
        value = dict(metadata or ()).get(OLDEST_SEQ_KEY)
        if value is None or not str(value).isdigit():
            return  # a server that does not say
        oldest = int(value)
        if oldest > self.last_seq + 1:
            self.gaps.append((self.last_seq, oldest))
            log.warning("events after the last seq are no longer all kept; some may be missing",
                        extra={"after_seq": self.last_seq, "oldest_kept": oldest})  # fmt: skip
            if self._on_gap is not None:
                self._on_gap(self.last_seq, oldest)

    def __iter__(self) -> Iterator[recognition_pb2.RecognitionEvent]:
        wait = self._backoff[0]
        first = True
        while not self._stop.is_set():
            if not first:
                self.reconnects += 1
            first = False
            request = recognition_pb2.StreamEventsRequest(site=self.site, after_seq=self.last_seq)
            received = 0
            try:
                self._call = self._stub().StreamEvents(request, metadata=self.metadata)
                if self.last_seq:
                    self._check_kept(self._call.initial_metadata())
                for ev in self._call:
                    if ev.seq and ev.seq <= self.last_seq:
                        self.repeated += 1  # never handed out twice (a server keeping its promise sends none)
                        continue
                    received += 1
                    if ev.seq:
                        self.last_seq = ev.seq
                    yield ev
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if self._stop.is_set():
                    return
                if code in FATAL:
                    raise
                details = str(exc.details())[:200] if hasattr(exc, "details") else ""
                log.info("event stream lost; calling again",
                         extra={"code": str(code), "after_seq": self.last_seq, "details": details})  # fmt: skip
                if self._on_lost is not None:
                    self._on_lost(code.name if code is not None else "UNKNOWN", details)
            finally:
                self._call = None
            if received:
                wait = self._backoff[0]
            self._stop.wait(wait)
            wait = min(wait * 2, self._backoff[1])
