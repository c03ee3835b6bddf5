"""gRPC client-streaming ingest against an in-test servicer over real loopback sockets with TLS."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
from peep.core.release import secure_releaser
from peep.core.wire import encode_template, make_template
from peep.edge.agent import Agent
from peep.edge.config import GrpcConfig, load_config
from peep.edge.spool import Spool
from peep.edge.transport.grpc import GrpcForwarder
from peep.v1 import recognition_pb2, recognition_pb2_grpc, template_pb2

TOKEN = "device-token-cam-1"


class FakeRecognition(recognition_pb2_grpc.RecognitionServiceServicer):
    """Idempotent ingest by message id, bearer-token auth, injectable failures."""

    def __init__(
        self,
        *,
        reject: set[str] = frozenset(),
        fail_first: int = 0,
        delay_first: float = 0.0,
        refuse_enrolment: bool = False,
    ):
        self.refuse_enrolment = refuse_enrolment
        self.lock = threading.Lock()
        self.stored: list[str] = []
        self.received = 0
        self.calls = 0
        self.reject = set(reject)
        self.fail_first = fail_first
        self.delay_first = delay_first
        self.reports: list[recognition_pb2.DeviceReportRequest] = []

    def ReportDevice(self, request, context):
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "authorization: expected a valid bearer token")
        with self.lock:
            self.reports.append(request)
        return recognition_pb2.DeviceReportAck(received_at=time.time())

    def IngestStream(self, request_iterator, context):
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "authorization: expected a valid bearer token")
        with self.lock:
            self.calls += 1
            call = self.calls
        if call <= self.fail_first:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        if call == 1 and self.delay_first:
            time.sleep(self.delay_first)
        acks = []
        for msg in request_iterator:
            with self.lock:
                self.received += 1
                if self.refuse_enrolment and msg.purpose == template_pb2.PURPOSE_ENROLL:
                    acks.append(
                        recognition_pb2.IngestAck(
                            message_id=msg.message_id,
                            status=recognition_pb2.INGEST_STATUS_REJECTED,
                            reason="enrolment_not_permitted",
                        )
                    )
                elif msg.message_id in self.reject:
                    acks.append(
                        recognition_pb2.IngestAck(
                            message_id=msg.message_id,
                            status=recognition_pb2.INGEST_STATUS_REJECTED,
                            reason="bundle_id: unknown bundle",
                        )
                    )
                elif msg.message_id in self.stored:
                    acks.append(
                        recognition_pb2.IngestAck(
                            message_id=msg.message_id, status=recognition_pb2.INGEST_STATUS_DUPLICATE
                        )
                    )
                else:
                    self.stored.append(msg.message_id)
                    acks.append(
                        recognition_pb2.IngestAck(
                            message_id=msg.message_id, status=recognition_pb2.INGEST_STATUS_ACCEPTED
                        )
                    )
        return recognition_pb2.IngestSummary(acks=acks)


def serve(servicer, pki, port: int = 0):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    recognition_pb2_grpc.add_RecognitionServiceServicer_to_server(servicer, server)
    creds = grpc.ssl_server_credentials([(pki["server_key"].read_bytes(), pki["server"].read_bytes())])
    bound = server.add_secure_port(f"127.0.0.1:{port}", creds)
    server.start()
    return server, bound


@pytest.fixture
def templates(edge_bundle):
    releaser = secure_releaser(edge_bundle, kind="peep", epsilon=4.0, delta=0.0)

    def make(n: int) -> list[tuple[str, bytes]]:
        vals = releaser.release_bounded(np.full((n, edge_bundle.n_components), 0.5))
        out = []
        for v in vals:
            msg = make_template(
                v,
                device_id="cam-1",
                site="lab",
                bundle_id=releaser.bundle_id,
                mechanism=releaser.description,
                track_id="t-1",
            )
            out.append((msg.message_id, encode_template(msg)))
        return out

    return make


def spool_with(tmp_path, items) -> Spool:
    spool = Spool(tmp_path / "spool.sqlite3", destinations=["grpc"])
    for mid, payload in items:
        spool.put(message_id=mid, purpose="identify", payload=payload)
    return spool


def cfg(pki, port, **kw) -> GrpcConfig:
    base = {
        "enabled": True,
        "target": f"localhost:{port}",
        "ca_file": pki["ca"],
        "deadline_s": 2.0,
        "batch_size": 64,
        "retry_min_s": 0.1,
        "retry_max_s": 0.5,
    }
    base.update(kw)
    return GrpcConfig(**base)


def wait_until(pred, timeout=15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_server_down_at_start_then_every_template_delivered_once_in_order(tmp_path, pki, templates, h):
    items = templates(150)
    spool = spool_with(tmp_path, items)
    port = h.free_port()
    fwd = GrpcForwarder(cfg(pki, port), spool, token=TOKEN)
    fwd.start()
    time.sleep(0.8)  # calls fail: nothing listens yet
    assert spool.depth("grpc") == 150
    servicer = FakeRecognition()
    server, _ = serve(servicer, pki, port)
    try:
        assert wait_until(lambda: spool.depth("grpc") == 0)
        assert fwd.stop(2.0)
    finally:
        server.stop(0)
    assert servicer.stored == [mid for mid, _ in items]
    assert servicer.received == 150, "nothing sent twice"
    assert servicer.calls >= 3  # batches of 64
    assert fwd.metrics.value("peep_edge_reconnects_total", link="grpc") == 1
    assert fwd.metrics.value("peep_edge_published_total", transport="grpc") == 150
    spool.close()


def test_rejected_go_to_dead_letters_duplicates_are_acknowledged(tmp_path, pki, templates):
    items = templates(10)
    servicer = FakeRecognition(reject={items[3][0]})
    servicer.stored.append(items[5][0])  # the server already has this one
    server, port = serve(servicer, pki)
    spool = spool_with(tmp_path, items)
    fwd = GrpcForwarder(cfg(pki, port), spool, token=TOKEN)
    fwd.start()
    try:
        assert wait_until(lambda: spool.depth("grpc") == 0)
        fwd.stop(1.0)
    finally:
        server.stop(0)
    dead = spool.dead("grpc")
    assert [(d["message_id"], d["reason"]) for d in dead] == [(items[3][0], "bundle_id: unknown bundle")]
    assert fwd.metrics.value("peep_edge_dead_letter_total", transport="grpc") == 1
    assert sorted(servicer.stored) == sorted(mid for i, (mid, _) in enumerate(items) if i != 3)
    spool.close()


def test_wrong_token_or_untrusted_server_delivers_nothing_and_keeps_the_spool(tmp_path, pki, templates):
    servicer = FakeRecognition()
    server, port = serve(servicer, pki)
    spool = spool_with(tmp_path, templates(5))
    bad_token = GrpcForwarder(cfg(pki, port), spool, token="stolen-or-stale")
    untrusted = GrpcForwarder(cfg(pki, port, ca_file=pki["other_ca"]), spool, token=TOKEN)
    bad_token.start()
    untrusted.start()
    try:
        time.sleep(1.2)
        assert servicer.stored == []
        assert spool.depth("grpc") == 5
        assert bad_token.calls >= 2, "retried with backoff"
        assert untrusted.calls >= 1
    finally:
        bad_token.halt()
        untrusted.halt()
        bad_token.join(5)
        untrusted.join(5)
        server.stop(0)
    spool.close()


def test_deadline_exceeded_and_unavailable_are_retried_without_loss(tmp_path, pki, templates):
    items = templates(20)
    servicer = FakeRecognition(fail_first=0, delay_first=1.5)
    server, port = serve(servicer, pki)
    spool = spool_with(tmp_path, items)
    fwd = GrpcForwarder(cfg(pki, port, deadline_s=0.5), spool, token=TOKEN)
    fwd.start()
    try:
        assert wait_until(lambda: spool.depth("grpc") == 0)
        fwd.stop(1.0)
    finally:
        server.stop(0)
    assert servicer.calls >= 2
    assert sorted(servicer.stored) == sorted(mid for mid, _ in items)


def test_agent_over_grpc_only(make_config, crowd_video, pki, h):
    servicer = FakeRecognition(fail_first=1)
    server, port = serve(servicer, pki)
    try:
        config = load_config(
            make_config(
                capture={"source": crowd_video["path"]},
                privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 2.0, "min_track_frames": 2},
                mqtt={"enabled": False},
                grpc={
                    "enabled": True,
                    "target": f"localhost:{port}",
                    "ca_file": str(pki["ca"]),
                    "token_env": "PEEP_TEST_TOKEN",
                    "retry_min_s": 0.1,
                },
            )
        )
        agent = Agent(config, environ={"PEEP_TEST_TOKEN": TOKEN})
        assert agent.run() == 0
    finally:
        server.stop(0)
    from peep.edge.ledger import SqliteLedger

    ledger = SqliteLedger(config.ledger_path)
    ids = [s.message_id for s in ledger.entries()]
    ledger.close()
    assert len(ids) >= 10
    assert servicer.stored == ids
    # Without MQTT the device's report travels over gRPC: one when the forwarder starts, the final one at stop.
    from peep.core.reports import parse_device_report

    assert len(servicer.reports) >= 2
    last = servicer.reports[-1]
    assert (last.device_id, last.site) == (config.device.id, config.device.site)
    final = parse_device_report(last.report)
    assert final.releases == len(ids) and final.bundle_id == agent.releaser.bundle_id
    assert final.epsilon_coordinate == 4.0 and final.epsilon_vector_spent == len(ids) * final.epsilon_vector_per_release


class _OldServer(recognition_pb2_grpc.RecognitionServiceServicer):
    """A server from before ReportDevice: ingest works, the report RPC is UNIMPLEMENTED."""

    def __init__(self) -> None:
        self.stored: list[str] = []

    def IngestStream(self, request_iterator, context):
        acks = []
        for msg in request_iterator:
            self.stored.append(msg.message_id)
            acks.append(recognition_pb2.IngestAck(message_id=msg.message_id,
                                                  status=recognition_pb2.INGEST_STATUS_ACCEPTED))  # fmt: skip
        return recognition_pb2.IngestSummary(acks=acks)


def test_reports_stop_quietly_against_a_server_without_the_rpc(tmp_path, pki, templates):
    servicer = _OldServer()
    server, port = serve(servicer, pki)
    items = templates(5)
    spool = spool_with(tmp_path, items)
    calls = []

    def report() -> bytes:
        calls.append(1)
        return b"{}"

    fwd = GrpcForwarder(cfg(pki, port, report_interval_s=0.01), spool, token=TOKEN, report=report,
                        device_id="cam-1", site="lab")  # fmt: skip
    try:
        fwd.start()
        assert wait_until(lambda: len(servicer.stored) == 5)
        time.sleep(0.3)
        assert fwd.stop(5.0)
    finally:
        server.stop(0)
        spool.close()
    assert calls == [1] and fwd.reports_sent == 0  # asked once, then never again (no final report either)


class _OneReportASecond(FakeRecognition):
    """The server's rule for reports: one a second per device, a sooner one RESOURCE_EXHAUSTED (not kept)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0
        self._last = -1e9

    def ReportDevice(self, request, context):
        with self.lock:
            too_soon = time.monotonic() - self._last < 1.0
            if not too_soon:
                self._last = time.monotonic()
            else:
                self.refused += 1
        if too_soon:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "ReportDevice: expected at most one report per 1 s")
        return super().ReportDevice(request, context)


def test_the_final_report_is_kept_even_when_a_periodic_one_went_just_before(tmp_path, pki):
    """The server keeps one report a second per device. A camera stopped right after its periodic report would
    have its final one refused, and the server would show counts that miss the releases in between: the final
    report is tried again once the second has passed."""
    servicer = _OneReportASecond()
    server, port = serve(servicer, pki)
    spool = spool_with(tmp_path, [])
    counts = {"releases": 3}
    fwd = GrpcForwarder(cfg(pki, port, report_interval_s=60.0), spool, token=TOKEN,
                        report=lambda: f'{{"releases": {counts["releases"]}}}'.encode(),
                        device_id="cam-1", site="lab")  # fmt: skip
    try:
        fwd.start()
        assert wait_until(lambda: len(servicer.reports) == 1)
        counts["releases"] = 4  # a release the periodic report did not count (refused by the server, say)
        assert fwd.stop(5.0)
    finally:
        server.stop(0)
        spool.close()
    assert servicer.refused >= 1  # the first try came within the server's second
    assert [r.report for r in servicer.reports] == [b'{"releases": 3}', b'{"releases": 4}']
    assert fwd.reports_sent == 2


def test_a_final_report_refused_for_good_is_not_tried_again(tmp_path, pki, templates):
    servicer = FakeRecognition()
    server, port = serve(servicer, pki)
    spool = spool_with(tmp_path, templates(2))
    fwd = GrpcForwarder(cfg(pki, port, report_interval_s=60.0), spool, token="not-the-token",
                        report=lambda: b"{}", device_id="cam-1", site="lab")  # fmt: skip
    try:
        fwd.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        fwd.stop(0.0)
        took = time.monotonic() - t0
    finally:
        server.stop(0)
        spool.close()
    assert fwd.report_code == grpc.StatusCode.UNAUTHENTICATED and fwd.reports_sent == 0
    assert took < 1.0  # no wait for a second try that cannot succeed


class _NeverAnswers(FakeRecognition):
    """A server that accepts calls and never answers them (a frozen or hopelessly overloaded process)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.ingest_calls = 0
        self.report_calls = 0

    def IngestStream(self, request_iterator, context):
        with self.lock:
            self.ingest_calls += 1
        self.release.wait(60.0)
        context.abort(grpc.StatusCode.UNAVAILABLE, "gone")

    def ReportDevice(self, request, context):
        with self.lock:
            self.report_calls += 1
        self.release.wait(60.0)
        context.abort(grpc.StatusCode.UNAVAILABLE, "gone")


@pytest.mark.slow
def test_a_stop_while_the_server_never_answers_ends_within_the_drain_and_the_report_budget(tmp_path, pki, templates):
    """With the server frozen a device's stop took 15.5 s (a send's full deadline, then three final reports
    of 10 s each, cut short only by the join), past the 15 s its unit gives it: while stopping, every call's
    deadline is the drain time left, and the final report's tries together take at most their budget."""
    from peep.edge.transport.grpc import FINAL_REPORT_BUDGET_S

    servicer = _NeverAnswers()
    server, port = serve(servicer, pki)
    spool = spool_with(tmp_path, templates(3))
    fwd = GrpcForwarder(cfg(pki, port, deadline_s=10.0, report_interval_s=60.0), spool, token=TOKEN,
                        report=lambda: b"{}", device_id="cam-1", site="lab")  # fmt: skip
    try:
        fwd.start()
        assert wait_until(lambda: servicer.ingest_calls >= 1)  # a send is waiting on the server
        drain = 1.0
        t0 = time.monotonic()
        fwd.stop(drain)
        took = time.monotonic() - t0
        assert not fwd.is_alive()
    finally:
        servicer.release.set()
        server.stop(0)
        spool.close()
    assert servicer.report_calls >= 1  # the final report was tried
    assert spool_depth_was_kept(tmp_path) == 3  # nothing acknowledged: every template waits for the next run
    assert took <= drain + FINAL_REPORT_BUDGET_S + 1.0, took


def spool_depth_was_kept(tmp_path) -> int:
    with Spool(tmp_path / "spool.sqlite3", destinations=["grpc"]) as again:
        return again.depth("grpc")


def test_enrolment_refused_by_the_server_is_an_error_not_a_delivery(make_config, people, pki, tmp_path, capsys):
    """A camera that is not an enrolment desk: the server refuses each ENROLL template (dead letter);
    the spool empties as on delivery, but peep-edge enroll must say so and exit 1."""
    from peep.edge.cli import main

    servicer = FakeRecognition(refuse_enrolment=True)
    server, port = serve(servicer, pki)
    src = tmp_path / "src"
    src.mkdir()
    for p in people[sorted(people)[4]][:4]:
        shutil.copy(p, src / p.name)
    path = make_config(
        privacy={"epsilon": 4.0, "track_budget": 1e6, "enroll_budget": 1e6},
        mqtt={"enabled": False},
        grpc={"enabled": True, "target": f"localhost:{port}", "ca_file": str(pki["ca"]),
              "token_env": "PEEP_TEST_TOKEN", "retry_min_s": 0.1},
    )  # fmt: skip
    try:
        os.environ["PEEP_TEST_TOKEN"] = TOKEN
        argv = ["enroll", "--config", str(path), "--subject", "alice", "--source", str(src), "--count", "3"]
        rc = main([*argv, "--timeout", "10"])
    finally:
        os.environ.pop("PEEP_TEST_TOKEN", None)
        server.stop(0)
    out = capsys.readouterr()
    assert rc == 1 and "delivered" not in out.out and "accepted" not in out.out
    assert "3 of 3 enrolment templates were refused by the server (enrolment_not_permitted)" in out.err
    assert servicer.stored == [] and servicer.received == 3


def test_one_enrolment_budget_per_subject_however_the_id_is_typed(make_config, people, pki, tmp_path, capsys):
    """'Zoë' typed composed (U+00EB) and decomposed (e + U+0308) is one subject: one budget."""
    from peep.edge.cli import main

    servicer = FakeRecognition()
    server, port = serve(servicer, pki)
    src = tmp_path / "src"
    src.mkdir()
    for p in people[sorted(people)[4]][:4]:
        shutil.copy(p, src / p.name)
    path = make_config(
        privacy={"epsilon": 4.0, "track_budget": 1e6, "enroll_budget": 600.0},  # two releases of 256 per vector
        mqtt={"enabled": False},
        grpc={"enabled": True, "target": f"localhost:{port}", "ca_file": str(pki["ca"]),
              "token_env": "PEEP_TEST_TOKEN", "retry_min_s": 0.1},
    )  # fmt: skip
    try:
        os.environ["PEEP_TEST_TOKEN"] = TOKEN
        argv = ["enroll", "--config", str(path), "--source", str(src), "--timeout", "10"]
        assert main([*argv, "--subject", "Zoe\u0308", "--count", "2"]) == 0, capsys.readouterr().err
        assert main([*argv, "--subject", "Zo\u00eb", "--count", "1"]) == 1
    finally:
        os.environ.pop("PEEP_TEST_TOKEN", None)
        server.stop(0)
    assert "privacy.enroll_budget: budget exceeded for key 'subject:Zo\u00eb'" in capsys.readouterr().err
    assert len(servicer.stored) == 2


KILLED_AFTER_THE_SERVERS_ACK = """
import os, signal, sys
from peep.edge.config import GrpcConfig
from peep.edge.spool import Spool
from peep.edge.transport.grpc import GrpcForwarder

spool_path, port, ca, token = sys.argv[1:5]
spool = Spool(spool_path, destinations=["grpc"])
# The server has committed the templates and answered ACCEPTED: the device dies before its DELETE.
spool.ack = lambda dest, ids: os.kill(os.getpid(), signal.SIGKILL)
cfg = GrpcConfig(enabled=True, target=f"localhost:{port}", ca_file=ca, deadline_s=5.0, retry_min_s=0.1, retry_max_s=0.5)
GrpcForwarder(cfg, spool, token=token).run()
"""


def test_a_crash_after_the_servers_ack_resends_and_the_duplicate_ack_deletes(tmp_path, pki, templates):
    items = templates(5)
    servicer = FakeRecognition()
    server, port = serve(servicer, pki)
    spool_with(tmp_path, items).close()
    path = tmp_path / "spool.sqlite3"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", KILLED_AFTER_THE_SERVERS_ACK, str(path), str(port), str(pki["ca"]), TOKEN],
            capture_output=True,
            timeout=60,
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
        assert servicer.stored == [mid for mid, _ in items], "the server has every template"
        spool = Spool(path, destinations=["grpc"])
        assert spool.depth("grpc") == 5, "the device still has them: nothing was deleted before the crash"
        fwd = GrpcForwarder(cfg(pki, port), spool, token=TOKEN)
        fwd.start()
        assert wait_until(lambda: spool.depth("grpc") == 0)
        fwd.stop(1.0)
    finally:
        server.stop(0)
    assert servicer.received == 10 and servicer.stored == [mid for mid, _ in items], "resent, stored once"
    assert spool.dead() == [], "DUPLICATE is a delivery, not a refusal"
    assert fwd.metrics.value("peep_edge_published_total", transport="grpc") == 5
    spool.close()
    on_disk = b"".join(p.read_bytes() for p in tmp_path.glob("spool.sqlite3*"))
    assert all(payload not in on_disk for _, payload in items)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_camera_sends_again_within_seconds_of_the_server_returning_after_a_long_outage(tmp_path, pki, templates, h):
    """The channel's wait between attempts to connect stops growing at ``grpc.reconnect_max_s`` (5 s): while it
    waits every call fails at once, so with gRPC's own growing wait (capped at ``retry_max_s``, 60 s, before)
    a camera whose server was away 30 s sent again up to 20 s after it returned."""
    items = templates(80)
    spool = Spool(tmp_path / "spool.sqlite3", destinations=["grpc"])
    port = h.free_port()
    shipped = GrpcConfig.model_fields
    fwd = GrpcForwarder(cfg(pki, port, retry_min_s=shipped["retry_min_s"].default,
                            retry_max_s=shipped["retry_max_s"].default), spool, token=TOKEN)  # fmt: skip
    assert fwd.cfg.reconnect_max_s == 5.0
    fwd.start()
    stop = threading.Event()

    def camera() -> None:  # a release every half second, as a camera seeing people makes, each waking the forwarder
        for mid, payload in items:
            if stop.wait(0.5):
                return
            spool.put(message_id=mid, purpose="identify", payload=payload)

    releasing = threading.Thread(target=camera, daemon=True)
    releasing.start()
    time.sleep(30.0)  # the server is away: every attempt to connect is refused, and the channel's wait grows
    assert spool.depth("grpc") >= 50  # none delivered
    servicer = FakeRecognition()
    server, _ = serve(servicer, pki, port)
    back = time.monotonic()
    try:
        assert wait_until(lambda: servicer.received > 0, timeout=30.0)
        waited = time.monotonic() - back
        stop.set()
        releasing.join(5)
        assert wait_until(lambda: spool.depth("grpc") == 0)
        assert fwd.stop(2.0)
    finally:
        stop.set()
        server.stop(0)
    # At most the ceiling and gRPC's jitter (a fifth) after the server is back, and the call itself.
    assert waited <= 5.0 * 1.2 + 1.0, f"the first template arrived {waited:.1f} s after the server returned"
    assert sorted(servicer.stored) == sorted(mid for mid, _ in items[: len(servicer.stored)])
    assert servicer.received == len(servicer.stored), "nothing sent twice"
    spool.close()
