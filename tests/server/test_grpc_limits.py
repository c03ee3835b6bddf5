"""gRPC bounds over real TLS sockets: streams cannot starve unary calls, events stay in their site, fields are bounded.

Before these limits, as many idle streams as ``grpc.max_workers`` (16 reflection
streams without credentials, or 16 ``StreamEvents`` with one device token; 8 with 8 workers) made
``Health/Check`` and ``GetModelStatus`` time out; a device saw every site's recognitions; ``Verify`` took a
10 MB claim and answered an unknown subject OK with score 0; ``GetBundle`` with a 1 MB id answered
RESOURCE_EXHAUSTED echoing the id.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from peep.server.config import ConfigError, GrpcConfig, parse_config
from peep.server.transport.limits import server_options
from peep.v1 import recognition_pb2, recognition_pb2_grpc
from peep_testing.server import (
    ADMIN,
    DEVICE,
    DEVICE_TOKENS,
    SITE,
    auth,
    base_config,
    sha,
    start_server,
    tls_section,
)
from peep_testing.server import (
    rpc_error as _code,
)

CAM2 = auth(DEVICE_TOKENS["cam-2"])
MB = 1024 * 1024


def _serve(tmp_path, pki, keypair, bundle_dir, trained_server=None, *, grpc_opts=None, auth_opts=None):
    """A TLS server; with ``trained_server``, serving its model (the model directory is shared, read-only)."""
    sections: dict[str, Any] = {"grpc": {"tls": tls_section(pki), **(grpc_opts or {})}}
    if trained_server is not None:
        sections["training"] = {"model_dir": str(trained_server.tmp / "models")}
    if auth_opts is not None:
        sections["auth"] = auth_opts
    srv = start_server(base_config(tmp_path, keypair[3], bundle_dir, **sections), pki, tmp_path)
    if trained_server is not None:
        assert srv.services.recogniser.model is not None
    return srv


class Streams:
    """Open idle streams (nothing sent after the request) and tell which were accepted or refused."""

    def __init__(self, srv: Any) -> None:
        self.srv = srv
        self.release = threading.Event()
        self.channel = srv.channel()
        self.calls: list[Any] = []

    def _idle_requests(self):
        self.release.wait(60)
        return
        yield  # a generator that sends nothing until released

    def open(self, kind: str, metadata: Any = None, *, request: Any = None) -> Any:
        ch = self.channel
        if kind == "reflection":
            call = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                self._idle_requests(), metadata=metadata, timeout=60
            )
        elif kind == "watch":
            call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), metadata=metadata, timeout=60)
        elif kind == "events":
            req = request or recognition_pb2.StreamEventsRequest()
            call = recognition_pb2_grpc.RecognitionServiceStub(ch).StreamEvents(req, metadata=metadata, timeout=60)
        elif kind == "ingest":
            call = recognition_pb2_grpc.RecognitionServiceStub(ch).IngestStream.future(
                self._idle_requests(), metadata=metadata, timeout=60
            )
        else:
            raise ValueError(kind)
        self.calls.append(call)
        return call

    def outcome(self, kind: str, metadata: Any = None, **kw: Any) -> tuple[str, str]:
        """Open one stream; ("open", "") once the server counts it, or (code name, details) when refused."""
        limiter = self.srv.app.server.peep_streams
        before = limiter.open_streams
        call = self.open(kind, metadata, **kw)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if call.done():
                return call.code().name, call.details()
            if limiter.open_streams > before:
                return "open", ""
            time.sleep(0.01)
        raise AssertionError(f"{kind}: neither open nor refused after 5 s")

    def close(self) -> None:
        self.release.set()
        for c in self.calls:
            c.cancel()
        self.channel.close()


def _unary_calls_answer(srv: Any, template: Any, *, deadline: float = 2.0) -> None:
    """Health/Check, GetModelStatus and Identify each answer within their gRPC deadline of ``deadline`` seconds."""
    ch = srv.channel()
    try:
        h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=deadline)
        assert h.status == health_pb2.HealthCheckResponse.SERVING
        stub = recognition_pb2_grpc.RecognitionServiceStub(ch)
        assert stub.GetModelStatus(recognition_pb2.ModelStatusRequest(), metadata=CAM2, timeout=deadline).model_version
        r = stub.Identify(recognition_pb2.IdentifyRequest(template=template), metadata=CAM2, timeout=deadline)
        assert r.model_version and r.candidates
    finally:
        ch.close()


# --------------------------------------------------------------------------- streams vs unary calls


@pytest.mark.slow
def test_idle_streams_beyond_the_worker_count_leave_unary_calls_answering(
    tmp_path, pki, keypair, bundle_dir, trained_server, templates
):
    """The failing case's numbers: 20 idle reflection streams without credentials and 10 StreamEvents of one device.

    Before: the 16th idle stream froze Health/Check and GetModelStatus (16 workers). Now a caller holds at
    most grpc.max_streams_per_identity streams, the rest are refused at once, and unary calls answer.
    """
    srv = _serve(tmp_path, pki, keypair, bundle_dir, trained_server, grpc_opts={"reflection": "open"})
    streams = Streams(srv)
    try:
        refl = [streams.outcome("reflection") for _ in range(20)]
        events = [streams.outcome("events", DEVICE) for _ in range(10)]
        _unary_calls_answer(srv, templates.message(int(templates.test[0]), device_id="cam-2"))
        cfg = srv.app.config.grpc
        assert (cfg.max_workers, cfg.max_streams_per_identity) == (16, 4)
        assert [o for o, _ in refl].count("open") == 4 and [o for o, _ in events].count("open") == 4
        for outcome, details in refl[4:] + events[4:]:
            assert outcome == "RESOURCE_EXHAUSTED", (outcome, details)
            assert "grpc.max_streams_per_identity" in details
        assert "callers without credentials has 4" in refl[4][1]
        assert "device 'cam-1' has 4" in events[4][1]
        assert srv.services.metrics.value("peep_grpc_streams") == 8
        assert srv.services.metrics.value("peep_grpc_streams_refused_total", {"reason": "per_identity"}) == 22
    finally:
        streams.close()
        srv.app.stop(0)


def test_stream_limits_per_caller_and_global_with_fewer_workers_than_streams(
    tmp_path, pki, keypair, bundle_dir, trained_server, templates
):
    """4 unary workers, 6 streams open: streams have threads of their own; over a limit they are refused."""
    srv = _serve(
        tmp_path,
        pki,
        keypair,
        bundle_dir,
        trained_server,
        grpc_opts={
            "reflection": "open",
            "max_workers": 4,
            "max_streams": 6,
            "max_streams_per_identity": 3,
            "max_concurrent_streams": 40,
        },
    )
    streams = Streams(srv)
    template = templates.message(int(templates.test[1]), device_id="cam-2")
    try:
        anon = [streams.outcome("reflection") for _ in range(4)] + [streams.outcome("watch")]
        assert [o for o, _ in anon] == ["open"] * 3 + ["RESOURCE_EXHAUSTED"] * 2
        assert all("grpc.max_streams_per_identity" in d for _, d in anon[3:])
        cam1 = [streams.outcome("events", DEVICE) for _ in range(4)]
        assert [o for o, _ in cam1] == ["open"] * 3 + ["RESOURCE_EXHAUSTED"]
        # the server is full: another device's streams are refused naming the global limit
        for kind in ("events", "ingest"):
            outcome, details = streams.outcome(kind, CAM2)
            assert outcome == "RESOURCE_EXHAUSTED" and "grpc.max_streams)" in details, details
            assert "expected at most 6 open streams on this server" in details
        assert srv.app.server.peep_streams.open_streams == 6
        # 6 idle streams, 4 unary workers: unary calls still answer, also 24 at once
        _unary_calls_answer(srv, template)
        stub = srv.stub()

        def identify(_: int) -> bool:
            req = recognition_pb2.IdentifyRequest(template=template)
            return bool(stub.Identify(req, metadata=CAM2, timeout=10).model_version)

        with ThreadPoolExecutor(8) as pool:  # each within its deadline
            assert all(pool.map(identify, range(24)))
        # a burst of new streams is refused at once and changes nothing
        burst = Streams(srv)
        try:
            calls = [burst.open("reflection") for _ in range(30)]
            for c in calls:
                with pytest.raises(grpc.RpcError) as e:
                    next(c)
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            burst.close()
        _unary_calls_answer(srv, template)
        # closing streams gives their slots back
        streams.close()
        deadline = time.monotonic() + 5
        while srv.app.server.peep_streams.open_streams and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.app.server.peep_streams.open_by_caller() == {}
        again = Streams(srv)
        try:
            assert again.outcome("events", CAM2) == ("open", "")
        finally:
            again.close()
    finally:
        streams.close()
        srv.app.stop(0)


@pytest.mark.slow
def test_idle_streams_end_and_a_flowing_ingest_stream_keeps_going(tmp_path, pki, keypair, bundle_dir, templates):
    """Idle streams are ended by the server (not by their 60 s client deadline) and give their thread back."""
    srv = _serve(
        tmp_path,
        pki,
        keypair,
        bundle_dir,
        grpc_opts={"reflection": "authenticated", "stream_idle_timeout_s": 1.0, "max_streams": 4},
    )
    streams = Streams(srv)
    try:
        # two rounds of 4 idle streams: 8 handlers, as many as the stream pool has threads (4 + 4 spare)
        for _ in range(2):
            idle = [streams.open("reflection", DEVICE), streams.open("events", DEVICE), streams.open("watch")]
            stalled = streams.open("ingest", DEVICE)
            for call in [*idle, stalled]:
                with pytest.raises(grpc.RpcError) as e:
                    if call is stalled:
                        call.result()
                    else:
                        for _ in call:
                            pass
                assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value.details()
                assert "no message either way for 1 s (grpc.stream_idle_timeout_s)" in e.value.details()
        assert srv.services.metrics.value("peep_grpc_streams_refused_total", {"reason": "idle"}) == 8
        # the ended handlers returned their threads: a 9th stream runs and is answered
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        r = reflection_pb2_grpc.ServerReflectionStub(srv.channel())
        resp = next(r.ServerReflectionInfo(iter([req]), metadata=DEVICE, timeout=5))
        assert "peep.v1.RecognitionService" in {s.name for s in resp.list_services_response.service}

        def slow(n: int, pause: float):
            for i in range(n):
                yield templates.message(i)
                time.sleep(pause)

        t0 = time.monotonic()
        summary = srv.stub().IngestStream(slow(8, 0.4), metadata=DEVICE, timeout=30)
        assert time.monotonic() - t0 > 3  # three times the idle timeout, and never idle
        assert summary.accepted == 8
        assert srv.app.server.peep_streams.open_streams == 0
    finally:
        streams.close()
        srv.app.stop(0)


def test_reflection_is_off_by_default_and_can_require_credentials(tmp_path, pki, keypair, bundle_dir):
    req = reflection_pb2.ServerReflectionRequest(list_services="")

    def list_services(srv: Any, metadata: Any = None) -> set[str]:
        r = reflection_pb2_grpc.ServerReflectionStub(srv.channel())
        resp = next(r.ServerReflectionInfo(iter([req]), metadata=metadata, timeout=5))
        return {s.name for s in resp.list_services_response.service}

    srv = _serve(tmp_path / "a", pki, keypair, bundle_dir)
    try:
        assert srv.app.config.grpc.reflection == "off"
        code, _ = _code(list_services, srv)
        assert code == grpc.StatusCode.UNIMPLEMENTED
    finally:
        srv.app.stop(0)
    srv = _serve(tmp_path / "b", pki, keypair, bundle_dir, grpc_opts={"reflection": True})  # true = authenticated
    try:
        assert srv.app.config.grpc.reflection == "authenticated"
        code, _ = _code(list_services, srv)
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "peep.v1.RecognitionService" in list_services(srv, DEVICE)
        h = health_pb2_grpc.HealthStub(srv.channel()).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert h.status == health_pb2.HealthCheckResponse.SERVING  # health needs no credentials
    finally:
        srv.app.stop(0)


def test_connection_settings_become_grpc_options(tmp_path, pki, keypair, bundle_dir):
    opts = dict(server_options(GrpcConfig()))
    assert opts["grpc.keepalive_time_ms"] == 60_000 and opts["grpc.keepalive_timeout_ms"] == 20_000
    assert opts["grpc.http2.min_ping_interval_without_data_ms"] == 10_000  # the edge pings every 30 s
    assert opts["grpc.max_connection_idle_ms"] == 300_000
    assert opts["grpc.max_connection_age_ms"] == 3_600_000 and opts["grpc.max_connection_age_grace_ms"] == 60_000
    assert opts["grpc.max_receive_message_length"] == 32 * MB
    srv = _serve(tmp_path, pki, keypair, bundle_dir, grpc_opts={"max_message_mb": 1})
    try:
        code, details = _code(
            srv.stub().GetBundle, recognition_pb2.GetBundleRequest(bundle_id="x" * (2 * MB)), metadata=DEVICE, timeout=5
        )
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and len(details) < 200
        assert srv.stub().GetBundle(recognition_pb2.GetBundleRequest(), metadata=DEVICE, timeout=5).bundle_id
    finally:
        srv.app.stop(0)


@pytest.mark.parametrize(
    ("grpc_opts", "message"),
    [
        ({"max_streams": 4, "max_streams_per_identity": 5}, "max_streams_per_identity: expected at most max_streams"),
        ({"max_streams": 64, "max_concurrent_streams": 64}, "max_concurrent_streams: expected more than max_streams"),
        ({"reflection": "public"}, "grpc.reflection"),
        ({"device_events": "all"}, "grpc.device_events"),
    ],
)
def test_stream_settings_are_validated(tmp_path, keypair, grpc_opts, message):
    cfg = base_config(tmp_path, keypair[3], None, grpc=grpc_opts, auth={"allow_insecure": True})
    with pytest.raises(ConfigError, match=message):
        parse_config(cfg)


# --------------------------------------------------------------------------- events stay in their site

TOKENS = {name: f"tok-{name}-{uuid.uuid4().hex}" for name in ("cam-g", "cam-x")}


def _event_devices() -> dict[str, Any]:
    from peep_testing.server import ADMIN_TOKEN

    return {
        "admin_token_sha256": sha(ADMIN_TOKEN),
        "devices": [
            {"id": "cam-1", "site": SITE, "token_sha256": sha(DEVICE_TOKENS["cam-1"])},
            {"id": "cam-2", "site": SITE, "token_sha256": sha(DEVICE_TOKENS["cam-2"])},
            {"id": "cam-g", "site": "gate", "token_sha256": sha(TOKENS["cam-g"])},
            {"id": "cam-x", "token_sha256": sha(TOKENS["cam-x"])},  # registered without a site
        ],
    }


def _collect(
    srv: Any,
    subscribers: dict[str, tuple[Any, str, set[str]]],
    senders: list[tuple[str, str, Any]],
    templates: Any,
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Subscribe, let each sender ingest two identify templates, return the message ids each subscriber got.

    ``subscribers`` maps a name to (metadata, site asked for, the senders it should see). Events are queued
    for their subscribers while Ingest runs, in order: once a subscriber has the second-round events of all
    the senders it should see, every first-round event queued for it has been delivered too (no fixed wait).
    Returns what each subscriber got and the message ids each sender sent.
    """
    got: dict[str, list[str]] = {name: [] for name in subscribers}
    calls = {}
    stub = srv.stub()
    for name, (md, site, _) in subscribers.items():
        calls[name] = stub.StreamEvents(recognition_pb2.StreamEventsRequest(site=site), metadata=md, timeout=30)

        def read(name: str = name) -> None:
            try:
                for ev in calls[name]:
                    got[name].append(ev.message_id)
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 5
    while srv.services.events.n_subscribers < len(subscribers) and time.monotonic() < deadline:
        time.sleep(0.02)
    sent: dict[str, list[str]] = {device: [] for device, _, _ in senders}
    for first in (10, 20):
        for k, (device, site, md) in enumerate(senders):
            msg = templates.message(int(templates.test[first + k]), device_id=device, site=site)
            assert stub.Ingest(msg, metadata=md, timeout=5).status == recognition_pb2.INGEST_STATUS_ACCEPTED
            sent[device].append(msg.message_id)
    fences = {name: {sent[d][1] for d in sees} for name, (_, _, sees) in subscribers.items()}
    deadline = time.monotonic() + 10
    while any(not f <= set(got[name]) for name, f in fences.items()) and time.monotonic() < deadline:
        time.sleep(0.02)
    for c in calls.values():
        c.cancel()
    return got, sent


def _ids(sent: dict[str, list[str]], *devices: str) -> set[str]:
    return {m for d in devices for m in sent[d]}


SENDERS = [
    ("cam-1", SITE, DEVICE),
    ("cam-2", SITE, CAM2),
    ("cam-g", "gate", auth(TOKENS["cam-g"])),
    ("cam-x", "annex", auth(TOKENS["cam-x"])),
]


def test_a_device_sees_only_its_own_sites_recognitions(tmp_path, pki, keypair, bundle_dir, trained_server, templates):
    srv = _serve(tmp_path, pki, keypair, bundle_dir, trained_server, auth_opts=_event_devices())
    try:
        assert srv.app.config.grpc.device_events == "site"
        everyone = {"cam-1", "cam-2", "cam-g", "cam-x"}
        subscribers = {
            "cam-1 all": (DEVICE, "", {"cam-1", "cam-2"}),
            "cam-1 lobby": (DEVICE, SITE, {"cam-1", "cam-2"}),
            "cam-g all": (auth(TOKENS["cam-g"]), "", {"cam-g"}),
            "cam-x all": (auth(TOKENS["cam-x"]), "", {"cam-x"}),
            "admin all": (ADMIN, "", everyone),
            "admin gate": (ADMIN, "gate", {"cam-g"}),
        }
        got, sent = _collect(srv, subscribers, SENDERS, templates)
        lobby = _ids(sent, "cam-1", "cam-2")
        assert set(got["cam-1 all"]) == lobby and set(got["cam-1 lobby"]) == lobby
        assert set(got["cam-g all"]) == _ids(sent, "cam-g")
        assert set(got["cam-x all"]) == _ids(sent, "cam-x")  # no registered site: its own recognitions only
        assert set(got["admin all"]) == _ids(sent, *everyone)
        assert set(got["admin gate"]) == _ids(sent, "cam-g")
        stub = srv.stub()
        for md, site in ((DEVICE, "gate"), (auth(TOKENS["cam-g"]), SITE)):
            code, details = _code(
                lambda md=md, site=site: next(
                    stub.StreamEvents(recognition_pb2.StreamEventsRequest(site=site), metadata=md, timeout=5)
                )
            )
            assert code == grpc.StatusCode.PERMISSION_DENIED and "(the site device" in details, details
    finally:
        srv.app.stop(0)


def test_devices_may_see_only_their_own_recognitions_or_none(
    tmp_path, pki, keypair, bundle_dir, trained_server, templates
):
    srv = _serve(
        tmp_path / "d", pki, keypair, bundle_dir, trained_server, grpc_opts={"device_events": "device"},
        auth_opts=_event_devices(),
    )  # fmt: skip
    try:
        subscribers = {"cam-1": (DEVICE, "", {"cam-1"}), "admin": (ADMIN, SITE, {"cam-1", "cam-2"})}
        got, sent = _collect(srv, subscribers, SENDERS, templates)
        assert set(got["cam-1"]) == _ids(sent, "cam-1")
        assert set(got["admin"]) == _ids(sent, "cam-1", "cam-2")
    finally:
        srv.app.stop(0)
    srv = _serve(
        tmp_path / "n", pki, keypair, bundle_dir, trained_server, grpc_opts={"device_events": "none"},
        auth_opts=_event_devices(),
    )  # fmt: skip
    try:
        stub = srv.stub()
        code, details = _code(
            lambda: next(stub.StreamEvents(recognition_pb2.StreamEventsRequest(), metadata=DEVICE, timeout=5))
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED and "grpc.device_events = 'none'" in details
        got, sent = _collect(srv, {"admin": (ADMIN, "", {"cam-1"})}, SENDERS[:1], templates)
        assert got["admin"] == sent["cam-1"]
    finally:
        srv.app.stop(0)


# --------------------------------------------------------------------------- bounded fields


def test_verify_bounds_the_claim_first_and_an_unknown_subject_is_not_found(
    tmp_path, pki, keypair, bundle_dir, trained_server, templates
):
    srv = _serve(tmp_path, pki, keypair, bundle_dir, trained_server)
    try:
        stub = srv.stub()
        msg = templates.message(int(templates.test[0]))
        broken = templates.message(int(templates.test[0]))
        broken.bundle_id = "eb-unknown"
        for template in (msg, broken):  # the claim is refused before the template is even looked at
            req = recognition_pb2.VerifyRequest(template=template, claimed_subject="a" * (10 * MB))
            code, details = _code(stub.Verify, req, metadata=DEVICE, timeout=10)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("claimed_subject: expected 1-128")
            assert len(details) < 400
        code, details = _code(
            stub.Verify,
            recognition_pb2.VerifyRequest(template=msg, claimed_subject="nobody"),
            metadata=DEVICE,
            timeout=5,
        )
        assert code == grpc.StatusCode.NOT_FOUND
        assert details == "claimed_subject: expected a subject enrolled in the serving model v000001, received 'nobody'"
        enrolled = str(templates.subjects[templates.test[0]])
        ok = stub.Verify(
            recognition_pb2.VerifyRequest(template=msg, claimed_subject=enrolled), metadata=DEVICE, timeout=5
        )
        assert ok.model_version == "v000001" and ok.score > 0
    finally:
        srv.app.stop(0)


def test_get_bundle_refuses_an_oversized_or_malformed_id_naming_the_field(tmp_path, pki, keypair, bundle_dir):
    srv = _serve(tmp_path, pki, keypair, bundle_dir)
    try:
        stub = srv.stub()
        for bad in ("e" * MB, "../../etc/passwd", "eb-\u202egnp"):
            code, details = _code(
                stub.GetBundle, recognition_pb2.GetBundleRequest(bundle_id=bad), metadata=DEVICE, timeout=5
            )
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("bundle_id: expected ''"), details
            assert len(details) < 300
        code, details = _code(
            stub.GetBundle, recognition_pb2.GetBundleRequest(bundle_id="e" * MB), metadata=DEVICE, timeout=5
        )
        assert details.endswith("... (1048576 characters)")
        code, _ = _code(
            stub.GetBundle, recognition_pb2.GetBundleRequest(bundle_id="eb-00000000000000000000"), metadata=DEVICE,
            timeout=5,
        )  # fmt: skip
        assert code == grpc.StatusCode.NOT_FOUND
    finally:
        srv.app.stop(0)


def _string_fields(descriptor: Any) -> list[tuple[str, bool]]:
    from google.protobuf.descriptor import FieldDescriptor

    return [(f.name, f.is_repeated) for f in descriptor.fields if f.type == FieldDescriptor.TYPE_STRING]


def test_every_string_field_of_every_rpc_is_bounded_where_it_enters(
    tmp_path, pki, keypair, bundle_dir, trained_server, templates
):
    """A 1 MB value in any top-level string field: refused with a short message, never echoed, nothing done."""
    srv = _serve(tmp_path, pki, keypair, bundle_dir, trained_server)
    try:
        ch = srv.channel()
        service = recognition_pb2.DESCRIPTOR.services_by_name["RecognitionService"]
        huge = "s" * MB
        tried = []
        for method in service.methods:
            if method.client_streaming:
                continue  # IngestStream refuses per message in its summary (tests/server/test_fuzz.py)
            for name, repeated in _string_fields(method.input_type):
                req = GetMessageClass(method.input_type)()
                if method.name == "Ingest":
                    req.CopyFrom(templates.message(int(templates.test[2])))
                if method.name == "EnrolSubject" and name != "subject":
                    req.subject = "carol"
                if repeated:
                    getattr(req, name).append(huge)
                else:
                    setattr(req, name, huge)
                path = f"/peep.v1.RecognitionService/{method.name}"
                md = ADMIN if method.name in ("Train", "EraseSubject", "EnrolSubject", "PublishBundle") else DEVICE
                out_cls = GetMessageClass(method.output_type)
                if method.server_streaming:
                    call = ch.unary_stream(path, request_serializer=type(req).SerializeToString,
                                           response_deserializer=out_cls.FromString)  # fmt: skip
                    code, details = _code(lambda call=call, req=req, md=md: next(call(req, metadata=md, timeout=10)))
                else:
                    call = ch.unary_unary(path, request_serializer=type(req).SerializeToString,
                                          response_deserializer=out_cls.FromString)  # fmt: skip
                    code, details = _code(call, req, metadata=md, timeout=10)
                tried.append(f"{method.name}.{name}")
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (method.name, name, code, details[:200])
                # the field named, or (a template) the payload's size refused before parsing it
                assert name in details[:60] or details.startswith("payload: expected at most"), details[:200]
                assert len(details) < 400, (method.name, name, len(details))
        assert {"Verify.claimed_subject", "GetBundle.bundle_id", "StreamEvents.site", "Train.preset",
                "EraseSubject.subject", "EnrolSubject.message_ids", "PublishBundle.bundle_id",
                "Ingest.message_id"} <= set(tried)  # fmt: skip
        assert not srv.services.trainer.training and srv.services.recogniser.model.version == "v000001"
        assert srv.services.store.count_received() == 0
        h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert h.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        srv.app.stop(0)


def test_publish_bundle_bounds_file_names(tmp_path, pki, keypair, bundle_dir):
    srv = _serve(tmp_path, pki, keypair, bundle_dir)
    try:
        stub = srv.stub()
        files = stub.GetBundle(recognition_pb2.GetBundleRequest(), metadata=DEVICE, timeout=10)
        bad = recognition_pb2.BundleFiles()
        bad.CopyFrom(files)
        bad.files.add(name="n" * MB, content=b"")
        code, details = _code(stub.PublishBundle, bad, metadata=ADMIN, timeout=10)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"files[{len(files.files)}].name:")
        assert len(details) < 300
        many = recognition_pb2.BundleFiles(files=[recognition_pb2.BundleFile(name=f"f{i}") for i in range(17)])
        code, details = _code(stub.PublishBundle, many, metadata=ADMIN, timeout=10)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details == "files: expected at most 16 files, received 17"
    finally:
        srv.app.stop(0)


# --------------------------------------------------------------------------- silent peers


def _silent_calls(ch: Any, method: str, n: int, release: threading.Event, metadata: Any = None) -> list[Any]:
    """``n`` calls of a unary ``method`` that send their headers and never their request message."""

    def nothing():
        release.wait(60)
        return
        yield

    call = ch.stream_unary(method, request_serializer=lambda m: m, response_deserializer=lambda b: b)
    return [call.future(nothing(), metadata=metadata, timeout=60) for _ in range(n)]


def test_64_silent_unary_calls_hold_no_worker_and_end_after_the_request_timeout(
    tmp_path, pki, keypair, bundle_dir, trained_server, templates
):
    """Before: each call whose message never came held one of grpc.max_workers until its connection ended
    (max_connection_age_s): 4 such calls froze a server with 4 workers. Now the message is awaited on a reader
    thread, at most grpc.request_timeout_s, and a worker only ever runs a call whose message arrived."""
    srv = _serve(tmp_path, pki, keypair, bundle_dir, trained_server,
                 grpc_opts={"max_workers": 4, "request_timeout_s": 3.0})  # fmt: skip
    release = threading.Event()
    ch = srv.channel()
    try:
        silent = _silent_calls(ch, "/grpc.health.v1.Health/Check", 32, release)
        silent += _silent_calls(ch, "/peep.v1.RecognitionService/Identify", 32, release, metadata=DEVICE)
        time.sleep(0.5)  # all 64 on the server, waiting for their message
        assert not any(f.done() for f in silent)
        t0 = time.monotonic()
        _unary_calls_answer(srv, templates.message(int(templates.test[0]), device_id="cam-2"), deadline=2.0)
        assert time.monotonic() - t0 < 2.0
        # Each silent call ends once its request is late, DEADLINE_EXCEEDED naming the key.
        for f in silent:
            assert f.exception(10) is not None
        codes = {f.code() for f in silent}
        assert codes == {grpc.StatusCode.DEADLINE_EXCEEDED}, codes
        assert "grpc.request_timeout_s" in silent[0].details() and "grpc.request_timeout_s" in silent[-1].details()
        assert srv.services.metrics.value("peep_grpc_streams_refused_total", {"reason": "request_timeout"}) == 64
        # A unary call sent as usual is untouched, and a stream with a unary request still gets its message.
        _unary_calls_answer(srv, templates.message(int(templates.test[1]), device_id="cam-2"))
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
    finally:
        release.set()
        ch.close()
        srv.app.stop(0)


def test_a_silent_stream_request_counts_in_its_callers_stream_budget_and_ends_after_the_timeout(
    tmp_path, pki, keypair, bundle_dir
):
    """StreamEvents' one request: awaited within grpc.request_timeout_s, the stream counted meanwhile."""
    srv = _serve(tmp_path, pki, keypair, bundle_dir, grpc_opts={"request_timeout_s": 2.0})
    release = threading.Event()
    ch = srv.channel()
    try:
        call = ch.stream_stream("/peep.v1.RecognitionService/StreamEvents", request_serializer=lambda m: m,
                                response_deserializer=lambda b: b)  # fmt: skip

        def nothing():
            release.wait(60)
            return
            yield

        streams = [call(nothing(), metadata=DEVICE, timeout=60) for _ in range(6)]
        time.sleep(0.5)
        assert srv.app.server.peep_streams.open_by_caller() == {"device:cam-1": 4}  # the rest refused at once
        outcomes = []
        for s in streams:
            with pytest.raises(grpc.RpcError) as err:
                next(s)
            outcomes.append(err.value.code())
        assert outcomes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 2
        assert outcomes.count(grpc.StatusCode.DEADLINE_EXCEEDED) == 4
        # The client hears the deadline as the server ends the call; the server's count drops just after.
        limiter = srv.app.server.peep_streams
        end = time.monotonic() + 5
        while limiter.open_streams and time.monotonic() < end:
            time.sleep(0.05)
        assert limiter.open_streams == 0
    finally:
        release.set()
        ch.close()
        srv.app.stop(0)
