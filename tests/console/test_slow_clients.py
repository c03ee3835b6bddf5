"""Slow clients cannot lock operators out of the console: a deadline for each TLS handshake and each request,
and connection limits, counted from accept, that close the longest-waiting connection rather than refuse a new
one.

Servers of their own (no model: the pages asked for need none): ``quick`` with a 2 s request deadline to watch
it act, ``crowded`` with a 30 s one so that only the limits can make room while the flood lasts, ``handshaking``
with a 3 s handshake deadline and small limits.
"""

from __future__ import annotations

import gc
import resource
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from peep_testing.console import PASSWORDS, ROLES, login_token
from peep_testing.server import RunningServer, base_config, make_pki, start_server, tls_section

QUICK_TIMEOUT_S = 2.0
#: uvicorn's keep-alive timeout (its default, which the console keeps).
KEEP_ALIVE_S = 5.0
HANDSHAKE_TIMEOUT_S = 3.0
#: Requests of the operator that must get through the flood, each within this many seconds.
ANSWER_S = 2.0
#: Client and server ends of the flood's connections, with room for the rest of the process.
FDS_NEEDED = 4096


@dataclass
class Listener:
    server: RunningServer
    ctx: ssl.SSLContext

    @property
    def console(self) -> Any:
        return self.server.app.console

    @property
    def guard(self) -> Any:
        return self.console.guard

    def client(self, **kw: Any) -> Any:
        import httpx

        return httpx.Client(base_url=self.console.url, verify=self.ctx, follow_redirects=False, **kw)

    def connect(self, source: str = "127.0.0.1") -> ssl.SSLSocket:
        """A connection that has completed TLS and sent nothing."""
        return self.ctx.wrap_socket(self.connect_tcp(source), server_hostname="localhost")

    def connect_tcp(self, source: str = "127.0.0.1") -> socket.socket:
        """A TCP connection that has not begun TLS."""
        return socket.create_connection(("127.0.0.1", self.console.port), timeout=10, source_address=(source, 0))


@contextmanager
def _listener(tmp_path_factory: pytest.TempPathFactory, **console: Any) -> Iterator[Listener]:
    from peep.lab.bench.server import synthetic_bundle
    from peep.server.console import accounts
    from peep.server.console.store import ConsoleStore

    tmp = tmp_path_factory.mktemp("slow-clients")
    pki = make_pki(tmp_path_factory.mktemp("slow-clients-pki"))
    _bundle, pub = synthetic_bundle(tmp)
    cfg = base_config(
        tmp, pub, tmp / "bundle", grpc={"tls": tls_section(pki)}, console={"listen": "127.0.0.1:0", **console}
    )
    srv = start_server(cfg, pki, tmp)
    try:
        ConsoleStore(srv.services.store).add_account(
            "olga", ROLES["olga"], accounts.hash_password(PASSWORDS["olga"]), must_change=False
        )
        yield Listener(srv, ssl.create_default_context(cafile=str(pki.dir / "ca.pem")))
    finally:
        srv.app.stop(0)


@pytest.fixture(scope="module", autouse=True)
def _enough_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < FDS_NEEDED:
        if hard != resource.RLIM_INFINITY and hard < FDS_NEEDED:
            pytest.skip(f"the open-file hard limit is {hard}; the flood needs {FDS_NEEDED} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (FDS_NEEDED, hard))


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listener]:
    with _listener(tmp_path_factory, header_timeout_s=QUICK_TIMEOUT_S) as listener:
        yield listener


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listener]:
    # The default limits; a deadline longer than the test so that idle connections stay until evicted.
    with _listener(tmp_path_factory, header_timeout_s=30.0) as listener:
        yield listener


@pytest.fixture(scope="module")
def handshaking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listener]:
    # A request deadline longer than the tests: only the handshake deadline and the limits close connections.
    with _listener(
        tmp_path_factory,
        tls_handshake_timeout_s=HANDSHAKE_TIMEOUT_S,
        header_timeout_s=30.0,
        max_connections=32,
        max_connections_per_address=16,
    ) as listener:
        yield listener


def _closed_after(
    sock: ssl.SSLSocket | socket.socket, limit: float, *, dribble: bytes = b"", every: float = 0.5
) -> float:
    """Seconds until the server closes ``sock`` (at most ``limit``), sending ``dribble`` a byte at a time."""
    start = time.monotonic()
    sock.settimeout(every)
    sent = 0
    while time.monotonic() - start < limit:
        try:
            if sent < len(dribble):
                sock.sendall(dribble[sent : sent + 1])
                sent += 1
            if not sock.recv(4096):
                break
        except (TimeoutError, ssl.SSLWantReadError):
            continue
        except OSError:  # reset or aborted mid-TLS: closed all the same
            break
    return time.monotonic() - start


def _is_closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (which it never sends anything on before closing)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset: the server aborted it
        return True
    finally:
        sock.settimeout(10)


def _read_response(sock: ssl.SSLSocket) -> bytes:
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(4096)
    return head


def _operator_gets_in(listener: Listener) -> list[float]:
    """Log in and open Live as a fresh client; the seconds each request took (each must answer in time)."""
    took = []
    with listener.client(timeout=ANSWER_S) as c:
        start = time.monotonic()
        token = login_token(c)
        took.append(time.monotonic() - start)
        start = time.monotonic()
        r = c.post("/login", data={"name": "olga", "password": PASSWORDS["olga"], "csrf": token})
        took.append(time.monotonic() - start)
        assert r.status_code == 303, r.text
        start = time.monotonic()
        r = c.get("/live")
        took.append(time.monotonic() - start)
        assert r.status_code == 200, r.text
    assert max(took) < ANSWER_S, took
    return took


def _grpc_serving(listener: Listener) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with listener.server.channel() as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=ANSWER_S).status
    assert status == health_pb2.HealthCheckResponse.SERVING


class _Dribbler(threading.Thread):
    """Sends a partial request head one byte every ``every`` seconds on each socket, as a slowloris does."""

    HEAD = b"GET /login HTTP/1.1\r\nHost: localhost\r\nUser-Agent: " + b"x" * 200

    def __init__(self, socks: list[ssl.SSLSocket], every: float) -> None:
        super().__init__(daemon=True)
        self.socks, self.every, self.stop = list(socks), every, threading.Event()

    def run(self) -> None:
        for i in range(len(self.HEAD)):
            for s in list(self.socks):
                try:
                    s.sendall(self.HEAD[i : i + 1])
                except OSError:
                    self.socks.remove(s)
            if self.stop.wait(self.every):
                return


def _close_all(socks: Sequence[socket.socket]) -> None:
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def _wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --------------------------------------------------------------------------- what a closed connection leaves


def _tls_states_alive() -> int:
    from asyncio import sslproto

    # type(), not isinstance(): isinstance reads __class__, which some proxies in the process warn on (torch's).
    return sum(1 for o in gc.get_objects() if type(o) is sslproto.SSLProtocol)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("listener", "ending", "n"),
    [
        ("quick", "client_closes", 12),
        ("quick", "header_timeout", 4),
        ("crowded", "keep_alive_ends", 3),
        # An idle browser's or httpx's pooled connection: the keep-alive close arrives, the client resets.
        ("crowded", "reset_after_keep_alive", 3),
    ],
)
def test_a_closed_connection_frees_its_tls_state_at_once(request, listener, ending, n):
    """Each connection's TLS state holds a 256 KiB buffer. Left to the cyclic garbage collector, whose full
    collections grow rarer as the server's objects grow, an operator's connection every few seconds made the
    console's replica creep by tens of MB an hour in the soak; freed as the connection closes, it does not."""
    served: Listener = request.getfixturevalue(listener)
    gc.collect()
    before = _tls_states_alive()
    gc.disable()  # only what reference counting frees counts
    try:
        for _ in range(n):
            with served.connect() as sock:
                sock.sendall(b"GET /login HTTP/1.1\r\nHost: localhost\r\n\r\n")
                assert _read_response(sock).startswith(b"HTTP/1.1 200")
                if ending in ("header_timeout", "keep_alive_ends"):  # open until the server closes it
                    assert _closed_after(sock, limit=15) < 12
                elif ending == "reset_after_keep_alive":
                    time.sleep(KEEP_ALIVE_S + 1)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert _wait_for(lambda: served.guard.open == 0, 10), served.guard.open
        _wait_for(lambda: _tls_states_alive() - before <= 1, 2)
        left = _tls_states_alive() - before
    finally:
        gc.enable()
    assert left <= 1, f"{left} of {n} closed connections' TLS state waits for the cyclic garbage collector"


# --------------------------------------------------------------------------- the deadline


def test_a_connection_that_sends_nothing_is_closed_after_header_timeout(quick):
    before = quick.guard.closed["header_timeout"]
    with quick.connect() as sock:
        took = _closed_after(sock, limit=4 * QUICK_TIMEOUT_S)
    assert QUICK_TIMEOUT_S - 0.3 < took < QUICK_TIMEOUT_S + 1.5, took
    assert quick.guard.closed["header_timeout"] == before + 1
    assert quick.server.services.metrics.value(
        "peep_console_connections_closed_total", {"reason": "header_timeout"}
    ) == float(quick.guard.closed["header_timeout"])


@pytest.mark.slow
def test_a_head_sent_a_byte_at_a_time_does_not_keep_a_connection_open(quick):
    """Each byte would restart uvicorn's keep-alive timer; the deadline counts from the connection (resp. the
    previous response), not from the last byte."""
    with quick.connect() as sock:
        took = _closed_after(sock, limit=4 * QUICK_TIMEOUT_S, dribble=_Dribbler.HEAD, every=0.4)
    assert took < QUICK_TIMEOUT_S + 1.5, took

    with quick.connect() as sock:
        sock.sendall(b"GET /login HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        took = _closed_after(sock, limit=4 * QUICK_TIMEOUT_S, dribble=_Dribbler.HEAD, every=0.4)
    assert took < QUICK_TIMEOUT_S + 1.5, took


def test_a_request_body_must_arrive_within_the_deadline_too(quick):
    with quick.connect() as sock:
        sock.sendall(
            b"POST /login HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 200\r\n\r\n"
        )
        took = _closed_after(sock, limit=4 * QUICK_TIMEOUT_S, dribble=b"name=" + b"x" * 195, every=0.4)
    assert took < QUICK_TIMEOUT_S + 1.5, took


@pytest.mark.slow
def test_a_live_event_stream_outlives_the_deadline(quick):
    """Once its request is in, a connection is its handler's: the Live page's stream runs on."""
    from google.protobuf.timestamp_pb2 import Timestamp
    from peep.v1 import recognition_pb2, template_pb2

    with quick.client(timeout=10) as c:
        token = login_token(c)
        assert c.post("/login", data={"name": "olga", "password": PASSWORDS["olga"], "csrf": token}).status_code == 303
        with c.stream("GET", "/live/events") as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("retry:")
            time.sleep(2.5 * QUICK_TIMEOUT_S)
            quick.console.console.feed.add(
                recognition_pb2.RecognitionEvent(
                    event_id="slow-clients-1",
                    time=Timestamp(seconds=int(time.time())),
                    site="lobby",
                    device_id="cam-1",
                    purpose=template_pb2.PURPOSE_IDENTIFY,
                    subject="alice",
                    probability=0.9,
                    model_version="v000001",
                )
            )
            for line in lines:
                if line.startswith("data:"):
                    assert "slow-clients-1" in line
                    break
            else:
                pytest.fail("the event stream ended before the event")


# --------------------------------------------------------------------------- the limits


def test_a_flood_from_the_operators_address_does_not_lock_the_operator_out(crowded):
    """400 connections that send nothing and a few slowloris ones, all from the operator's address (a NAT):
    the operator still logs in and opens Live, and gRPC still answers."""
    guard = crowded.guard
    before = dict(guard.closed)
    idle = [crowded.connect() for _ in range(400)]
    slow = [crowded.connect() for _ in range(12)]
    dribbler = _Dribbler(slow, every=2.5)
    dribbler.start()
    try:
        # The address holds all the connections it may: only evicting one lets the operator in.
        assert _wait_for(lambda: guard.open == guard.max_connections_per_address, 5), guard.open
        _operator_gets_in(crowded)
        _grpc_serving(crowded)
        evicted = guard.closed["evicted"] - before["evicted"]
        assert evicted >= 400 + 12 - guard.max_connections_per_address + 1, evicted
        assert guard.closed["refused"] == before["refused"]
        assert guard.closed["header_timeout"] == before["header_timeout"]
        assert len(dribbler.socks) >= 10, "the slowloris connections were opened last: all but one stay"
    finally:
        dribbler.stop.set()
        _close_all(idle + slow)
        dribbler.join(5)
    assert _wait_for(lambda: guard.open == 0, 10), guard.open


def test_a_flood_from_many_addresses_does_not_lock_the_operator_out(crowded):
    """Connections that send nothing from eight other addresses fill max_connections; the operator's
    connection closes the one that has waited longest."""
    guard = crowded.guard
    assert _wait_for(lambda: guard.open == 0, 10), guard.open
    before = dict(guard.closed)
    per_address = guard.max_connections // 8
    socks = [crowded.connect(f"127.0.0.{2 + i % 8}") for i in range(8 * per_address)]
    try:
        assert _wait_for(lambda: guard.open == guard.max_connections, 5), guard.open
        assert guard.closed["evicted"] == before["evicted"]
        _operator_gets_in(crowded)
        _grpc_serving(crowded)
        assert guard.closed["evicted"] > before["evicted"]
        assert guard.closed["refused"] == before["refused"]
    finally:
        _close_all(socks)


# --------------------------------------------------------------------------- the TLS handshake


def test_connections_that_never_begin_tls_count_toward_the_limits_from_accept(handshaking):
    """Raw TCP connections that send nothing fill an address's share and then the whole listener: each one over a
    limit closes the longest waiting at once, and the operator (another address) still logs in and opens Live."""
    guard = handshaking.guard
    assert _wait_for(lambda: guard.open == 0, 10), guard.open
    before = dict(guard.closed)
    per_address, total = guard.max_connections_per_address, guard.max_connections
    first = [handshaking.connect_tcp("127.0.0.2") for _ in range(per_address + 24)]
    second = [handshaking.connect_tcp("127.0.0.3") for _ in range(per_address + 24)]
    third = [handshaking.connect_tcp("127.0.0.4") for _ in range(8)]
    socks = first + second + third
    try:
        # Each address over its share lost its oldest 24; the third address's 8 then closed the oldest 8 of all.
        expected_open = first[24 + 8 :] + second[24:] + third
        assert _wait_for(lambda: guard.open == total, 2), guard.open
        assert _wait_for(lambda: sum(_is_closed(s) for s in socks) == len(socks) - total, 2)
        assert not any(_is_closed(s) for s in expected_open)
        assert guard.closed["evicted"] - before["evicted"] == 24 + 24 + 8
        took = _operator_gets_in(handshaking)
        assert guard.closed["handshake_timeout"] == before["handshake_timeout"], "the flood outlived the operator"
        assert max(took) < ANSWER_S
        _grpc_serving(handshaking)
        assert guard.closed["refused"] == before["refused"]
    finally:
        _close_all(socks)
    assert _wait_for(lambda: guard.open == 0, 2 * HANDSHAKE_TIMEOUT_S), guard.open


@pytest.mark.parametrize(
    "dribble",
    [b"", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 32],
    ids=["silent", "client-hello-a-byte-at-a-time"],
)
def test_a_connection_that_does_not_finish_its_handshake_is_closed_after_the_handshake_timeout(handshaking, dribble):
    guard = handshaking.guard
    assert _wait_for(lambda: guard.open == 0, 10), guard.open
    before = guard.closed["handshake_timeout"]
    start = time.monotonic()
    socks = [handshaking.connect_tcp() for _ in range(5)]
    try:
        assert _wait_for(lambda: guard.open == 5, 2), guard.open
        _closed_after(socks[0], limit=4 * HANDSHAKE_TIMEOUT_S, dribble=dribble, every=0.3)
        took = time.monotonic() - start
        assert HANDSHAKE_TIMEOUT_S - 0.3 < took < HANDSHAKE_TIMEOUT_S + 1.5, took
        left = start + HANDSHAKE_TIMEOUT_S + 1.5 - time.monotonic()
        assert _wait_for(lambda: all(_is_closed(s) for s in socks), left)
    finally:
        _close_all(socks)
    assert guard.closed["handshake_timeout"] == before + 5
    assert guard.open == 0
    assert handshaking.server.services.metrics.value(
        "peep_console_connections_closed_total", {"reason": "handshake_timeout"}
    ) == float(guard.closed["handshake_timeout"])


# --------------------------------------------------------------------------- the bookkeeping


class _Conn:
    def __init__(self, address: str) -> None:
        self.address = address
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


def test_the_longest_waiting_connection_makes_room_and_a_new_one_is_refused_only_when_all_are_busy():
    from peep.server.console.connections import ConnectionGuard

    reasons: list[str] = []
    guard = ConnectionGuard(
        header_timeout_s=10,
        handshake_timeout_s=5,
        max_connections=4,
        max_connections_per_address=2,
        on_close=reasons.append,
    )
    a1, a2, a3, a4 = (_Conn("10.0.0.1") for _ in range(4))
    for c in (a1, a2):
        assert guard.admit(c)
        guard.wait(c)
    guard.wait(a1)  # a response on a1: a2 has now waited longest
    assert guard.admit(a3) and a2.dropped and not a1.dropped
    guard.wait(a3)
    guard.busy(a1)
    guard.busy(a3)
    assert not guard.admit(a4) and not a1.dropped and not a3.dropped

    b1, c1, d1 = _Conn("10.0.0.2"), _Conn("10.0.0.3"), _Conn("10.0.0.4")
    for c in (b1, c1):
        assert guard.admit(c)
        guard.wait(c)
    assert guard.open == 4
    assert guard.admit(d1) and b1.dropped and not c1.dropped
    assert guard.open == 4 and guard.waiting == 1

    guard.release(a1)
    guard.release(a1)
    guard.timed_out(c1)
    guard.timed_out(d1, "handshake_timeout")
    assert guard.open == 1 and guard.waiting == 0
    assert dict(guard.closed) == {"evicted": 2, "refused": 1, "header_timeout": 1, "handshake_timeout": 1}
    assert sorted(reasons) == ["evicted", "evicted", "handshake_timeout", "header_timeout", "refused"]


def test_the_limits_are_checked():
    from peep.server.config import ConsoleConfig
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"max_connections_per_address: expected at most max_connections \(100\)"):
        ConsoleConfig(max_connections=100, max_connections_per_address=101)
    with pytest.raises(ValidationError, match="header_timeout_s"):
        ConsoleConfig(header_timeout_s=0.5)
