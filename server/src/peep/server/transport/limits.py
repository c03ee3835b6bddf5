"""Streaming RPCs within bounds: their own threads, per-caller and global limits, an idle timeout.

Why: the synchronous gRPC server runs every RPC's handler on a worker thread until the RPC
ends, and a streaming RPC (``IngestStream``, ``StreamEvents``, server reflection, health
``Watch``) holds its thread for as long as the peer keeps it open, idle or not. With one shared
pool, as many idle streams as ``grpc.max_workers`` -- opened without any credential through
reflection, or by one device through ``StreamEvents`` -- left no thread for ``Health/Check``,
``Identify`` or ``Ingest``: the server froze until the streams were released.

:class:`StreamLimiter` (the outermost interceptor) makes streams harmless to unary calls:

* every streaming handler runs on a pool of its own (``max_streams`` threads plus
  :data:`SPARE_STREAM_THREADS` for refusals), so the unary pool (``grpc.max_workers``) is never
  occupied by a stream;
* at most ``max_streams`` streams are open on the server and at most ``max_per_identity`` per
  caller (a device, an admin credential; callers without credentials are one caller together);
  a stream over either limit is refused at once with ``RESOURCE_EXHAUSTED`` naming the limit;
* a stream with no message in either direction for ``idle_timeout_s`` is ended with
  ``DEADLINE_EXCEEDED`` naming ``grpc.stream_idle_timeout_s``: an ``IngestStream`` keeps going
  while templates flow, an idle ``StreamEvents`` subscriber re-subscribes.

:func:`server_options` turns the connection settings of ``[grpc]`` (keepalive, ping
enforcement, connection idle time and age, largest message) into gRPC channel arguments.

Unary requests within a deadline: the synchronous server reads the request message of a unary RPC on
the thread that will run its handler, so a peer that sent a call's headers and never its message (or
one byte a second) held a worker until its connection ended. :class:`StreamLimiter` serves unary
methods as request-streaming ones (the same bytes on the wire): the message is awaited on a *reader*
thread (a pool of ``max_concurrent_streams``, gRPC's own bound on calls), at most
``grpc.request_timeout_s`` (one thread watches every call's deadline), after which the call is ended
with ``DEADLINE_EXCEEDED`` naming the key; only a call whose message arrived takes one of the
``grpc.max_workers`` handler slots and runs, on its reader thread. A silent peer holds a reader for
that long and never a slot. Streams with a unary request (``StreamEvents``,
health ``Watch``) get their one message within the same deadline, counted in their caller's stream
budget meanwhile.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from peep.server.ingest.auth import AuthError, DeviceRegistry, authenticate

if TYPE_CHECKING:
    from peep.server.config import GrpcConfig
    from peep.server.metrics import ServerMetrics

log = logging.getLogger(__name__)

#: Threads of the stream pool beyond ``max_streams``: a stream over a limit is refused on one
#: of them, so refusals never wait behind the streams that are open.
SPARE_STREAM_THREADS = 4
#: How a caller without credentials is named in refusals (they share one budget).
ANONYMOUS = "callers without credentials"


def server_options(g: GrpcConfig) -> list[tuple[str, Any]]:
    """gRPC server channel arguments from ``[grpc]`` (keepalive, ping policy, connection bounds, message size)."""

    def ms(seconds: float) -> int:
        return round(seconds * 1000)

    return [
        ("grpc.max_receive_message_length", g.max_message_mb * 1024 * 1024),
        ("grpc.keepalive_time_ms", ms(g.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", ms(g.keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", ms(g.min_client_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_connection_idle_ms", ms(g.max_connection_idle_s)),
        ("grpc.max_connection_age_ms", ms(g.max_connection_age_s)),
        ("grpc.max_connection_age_grace_ms", ms(g.max_connection_age_grace_s)),
        ("grpc.so_reuseport", 0),
    ]


class _Deadlines:
    """One thread calling each registered function at its deadline unless cancelled first.

    A ``threading.Timer`` per unary call started a thread per call: about 0.5 ms more per Health/Check on
    this machine. Cancelled entries stay in the heap until their deadline and are dropped there.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[list[Any]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, at: float, fn: Callable[[], None]) -> list[Any]:
        """Call ``fn`` at ``at`` (``time.monotonic()`` seconds); the returned entry cancels it."""
        entry = [at, next(self._order), fn]
        with self._cv:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="peep-grpc-deadlines", daemon=True)
                self._thread.start()
            if self._heap[0] is entry:
                self._cv.notify()
        return entry

    @staticmethod
    def cancel(entry: list[Any]) -> None:
        entry[2] = None

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._heap and self._heap[0][2] is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cv.wait(delay)
                    continue
                fn = heapq.heappop(self._heap)[2]
            if fn is not None:
                try:
                    fn()
                except Exception:  # one call's ending never stops the others'
                    log.exception("request deadline failed")


@dataclass(eq=False)
class _Stream:
    method: str
    key: str
    who: str
    context: grpc.ServicerContext
    last: float
    closed: bool = field(default=False)


def _cancel(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """End an RPC from another thread with ``code`` and ``details`` (plain CANCELLED if that is not possible).

    ``ServicerContext.abort`` only works on the handler's own thread; a handler blocked waiting
    for the peer's next message is ended by cancelling the call in gRPC core with a status,
    which sends the peer that status and wakes the handler.
    """
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    if call is not None:
        try:
            call.cancel(code.value[0], details)
            return
        except Exception:  # another grpcio version: fall back to the public API
            pass
    context.cancel()


class StreamLimiter(grpc.ServerInterceptor):  # type: ignore[misc]
    """Run streaming RPCs on their own pool, within per-caller and global limits, ending idle ones.

    Parameters
    ----------
    registry : DeviceRegistry
        Who is calling (the same credentials :class:`~peep.server.ingest.auth.AuthInterceptor`
        checks; this interceptor only counts, the other one decides).
    max_streams : int
        Streams open at once on the server (``grpc.max_streams``).
    max_per_identity : int
        Streams open at once per caller (``grpc.max_streams_per_identity``).
    idle_timeout_s : float
        A stream without a message either way for this long is ended (``grpc.stream_idle_timeout_s``).
    metrics : ServerMetrics, optional
    clock : callable, optional
        Monotonic seconds (tests).
    """

    def __init__(
        self,
        registry: DeviceRegistry,
        *,
        max_streams: int,
        max_per_identity: int,
        idle_timeout_s: float,
        metrics: ServerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        request_timeout_s: float = 5.0,
        max_waiting: int = 128,
        max_workers: int = 16,
    ) -> None:
        self.registry = registry
        self.request_timeout_s = request_timeout_s
        self.reader_pool = futures.ThreadPoolExecutor(max_workers=max_waiting, thread_name_prefix="peep-grpc-read")
        #: Unary handlers running at once (grpc.max_workers), once their message arrived.
        self._slots = threading.BoundedSemaphore(max_workers)
        self._deadlines = _Deadlines()
        self.max_streams = max_streams
        self.max_per_identity = max_per_identity
        self.idle_timeout_s = idle_timeout_s
        self.metrics = metrics
        self.clock = clock
        self.pool = futures.ThreadPoolExecutor(
            max_workers=max_streams + SPARE_STREAM_THREADS, thread_name_prefix="peep-grpc-stream"
        )
        self._lock = threading.Lock()
        self._open: set[_Stream] = set()
        self._by_key: dict[str, int] = {}
        self._watchdog: threading.Thread | None = None

    @classmethod
    def from_config(
        cls, registry: DeviceRegistry, g: GrpcConfig, metrics: ServerMetrics | None = None
    ) -> StreamLimiter:
        return cls(
            registry,
            max_streams=g.max_streams,
            max_per_identity=g.max_streams_per_identity,
            idle_timeout_s=g.stream_idle_timeout_s,
            metrics=metrics,
            request_timeout_s=g.request_timeout_s,
            max_waiting=g.max_concurrent_streams,
            max_workers=g.max_workers,
        )

    # ------------------------------------------------------------ accounting

    @property
    def open_streams(self) -> int:
        with self._lock:
            return len(self._open)

    def open_by_caller(self) -> dict[str, int]:
        """Open streams per caller key (``device:ID``, ``admin:NAME``, ``""`` for no credentials)."""
        with self._lock:
            return dict(self._by_key)

    def _caller(self, context: grpc.ServicerContext) -> tuple[str, str]:
        try:
            ident = authenticate(self.registry, context.invocation_metadata() or (), context.auth_context())
        except AuthError:
            return "", ANONYMOUS
        if ident.is_admin:
            return f"admin:{ident.name}", f"admin {ident.name!r}"
        return f"device:{ident.name}", f"device {ident.name!r}"

    def _refuse(self, context: grpc.ServicerContext, reason: str, message: str) -> None:
        if self.metrics is not None:
            self.metrics.grpc_streams_refused.labels(reason).inc()
        log.info("stream refused", extra={"reason": reason, "detail": message})
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    def _enter(self, context: grpc.ServicerContext, method: str) -> _Stream:
        key, who = self._caller(context)
        name = method.rsplit("/", 1)[-1]
        with self._lock:
            total = len(self._open)
            mine = self._by_key.get(key, 0)
            if total < self.max_streams and mine < self.max_per_identity:
                s = _Stream(method=method, key=key, who=who, context=context, last=self.clock())
                self._open.add(s)
                self._by_key[key] = mine + 1
                self._start_watchdog_locked()
                if self.metrics is not None:
                    self.metrics.grpc_streams.set(len(self._open))
                return s
        if mine >= self.max_per_identity:
            self._refuse(
                context,
                "per_identity",
                f"{name}: expected at most {self.max_per_identity} open streams per caller "
                f"(grpc.max_streams_per_identity), {who} has {mine}: close one or retry later",
            )
        self._refuse(
            context,
            "global",
            f"{name}: expected at most {self.max_streams} open streams on this server (grpc.max_streams), "
            f"{total} are open: retry later",
        )
        raise AssertionError("unreachable: context.abort raises")  # pragma: no cover

    def _leave(self, s: _Stream) -> None:
        with self._lock:
            if s.closed:
                return
            s.closed = True
            self._open.discard(s)
            n = self._by_key.get(s.key, 0) - 1
            if n > 0:
                self._by_key[s.key] = n
            else:
                self._by_key.pop(s.key, None)
            if self.metrics is not None:
                self.metrics.grpc_streams.set(len(self._open))

    # ------------------------------------------------------------ idle streams

    def _start_watchdog_locked(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="peep-grpc-idle", daemon=True)
            self._watchdog.start()

    def _watch(self) -> None:
        """End idle streams; the thread exits when no stream is open (the next one starts it again)."""
        interval = min(1.0, self.idle_timeout_s / 4)
        while True:
            time.sleep(interval)
            now = self.clock()
            with self._lock:
                if not self._open:
                    self._watchdog = None
                    return
                idle = [s for s in self._open if now - s.last > self.idle_timeout_s]
            for s in idle:
                name = s.method.rsplit("/", 1)[-1]
                log.info("idle stream ended", extra={"method": name, "caller": s.who, "idle_s": self.idle_timeout_s})
                if self.metrics is not None:
                    self.metrics.grpc_streams_refused.labels("idle").inc()
                _cancel(
                    s.context,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"{name}: no message either way for {self.idle_timeout_s:g} s (grpc.stream_idle_timeout_s): "
                    "the server ended the stream; open a new one",
                )
                self._leave(s)

    # ------------------------------------------------------------ a unary request within its deadline

    def _first(self, requests: Iterator[Any], context: grpc.ServicerContext, method: str) -> Any:
        """The call's one request message, awaited at most ``request_timeout_s``; the call ends if it is late."""
        name = method.rsplit("/", 1)[-1]
        late = threading.Event()

        def too_late() -> None:
            late.set()
            if self.metrics is not None:
                self.metrics.grpc_streams_refused.labels("request_timeout").inc()
            log.info("request too slow", extra={"method": name, "timeout_s": self.request_timeout_s})
            _cancel(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"{name}: the request message did not arrive within {self.request_timeout_s:g} s "
                    "(grpc.request_timeout_s)")  # fmt: skip

        deadline = self._deadlines.add(time.monotonic() + self.request_timeout_s, too_late)
        try:
            request = next(requests, None)
        except grpc.RpcError:
            request = None  # ended: by the deadline, or the peer went away
        finally:
            self._deadlines.cancel(deadline)
        if request is None:
            context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED if late.is_set() else grpc.StatusCode.INVALID_ARGUMENT,
                f"{name}: expected one request message, received "
                + (f"none within {self.request_timeout_s:g} s (grpc.request_timeout_s)" if late.is_set() else "none"),
            )
        return request

    def _unary(self, behavior: Callable[..., Any], method: str) -> Any:
        def wrapper(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            request = self._first(requests, context, method)
            with self._slots:
                return behavior(request, context)

        wrapper.experimental_thread_pool = self.reader_pool  # type: ignore[attr-defined]
        return wrapper

    # ------------------------------------------------------------ wrapping

    def _requests(self, it: Iterator[Any], s: _Stream) -> Iterator[Any]:
        for item in it:
            s.last = self.clock()
            yield item

    def _responses(self, it: Iterator[Any] | None, s: _Stream) -> Iterator[Any]:
        try:
            if it is not None:
                for item in it:
                    s.last = self.clock()
                    yield item
        finally:
            self._leave(s)

    def _wrap(
        self, behavior: Callable[..., Any], method: str, *, requests: bool, responses: bool, first: bool = False
    ) -> Any:
        """``first``: ``behavior`` takes one request, read here from a request stream within request_timeout_s."""
        non_blocking = bool(getattr(behavior, "experimental_non_blocking", False))

        def wrapper(request: Any, context: grpc.ServicerContext, **kw: Any) -> Any:
            s = self._enter(context, method)
            context.add_callback(lambda: self._leave(s))
            if first:
                try:
                    request = self._first(request, context, method)
                except BaseException:
                    self._leave(s)
                    raise
            if requests:
                request = self._requests(request, s)
            try:
                if non_blocking and "send_response_callback" in kw:
                    send = kw["send_response_callback"]

                    def tracked(response: Any) -> None:
                        s.last = self.clock()
                        send(response)

                    kw["send_response_callback"] = tracked
                out = behavior(request, context, **kw)
            except BaseException:
                self._leave(s)
                raise
            if non_blocking:
                return out  # released by the termination callback
            if responses:
                return self._responses(out, s)
            self._leave(s)
            return out

        wrapper.experimental_thread_pool = self.pool  # type: ignore[attr-defined]
        if non_blocking:
            wrapper.experimental_non_blocking = True  # type: ignore[attr-defined]
        return wrapper

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        deser, ser = handler.request_deserializer, handler.response_serializer
        # Unary requests are read here within request_timeout_s (the module docstring): served as
        # request-streaming handlers, which receive the call before its message.
        if handler.unary_unary:
            return grpc.stream_unary_rpc_method_handler(self._unary(handler.unary_unary, method), deser, ser)
        if handler.unary_stream:
            fn = self._wrap(handler.unary_stream, method, requests=False, responses=True, first=True)
            return grpc.stream_stream_rpc_method_handler(fn, deser, ser)
        if handler.stream_unary:
            fn = self._wrap(handler.stream_unary, method, requests=True, responses=False)
            return grpc.stream_unary_rpc_method_handler(fn, deser, ser)
        fn = self._wrap(handler.stream_stream, method, requests=True, responses=True)
        return grpc.stream_stream_rpc_method_handler(fn, deser, ser)

    def close(self) -> None:
        """Release the stream and reader pools' idle threads (after the server stopped)."""
        self.pool.shutdown(wait=False)
        self.reader_pool.shutdown(wait=False)
