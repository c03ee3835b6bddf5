"""A device's report over gRPC (``ReportDevice``): its own credential only, bounded, rate-limited, kept per device.

The MQTT twin (retained ``…/report``) is tested through the shipped broker in test_mqtt_broker_security.py.
"""

from __future__ import annotations

import grpc
import pytest
from peep.core.reports import DeviceReport, parse_device_report
from peep.server.ingest.auth import Identity
from peep.server.ingest.ingestor import PermissionRefused
from peep.server.ingest.reports import DeviceReportBook, ReportTooFrequent
from peep.v1 import recognition_pb2
from peep_testing.server import ADMIN, DEVICE, DEVICE_TOKENS, SITE, auth
from peep_testing.server import rpc_error as _code

CAM2 = auth(DEVICE_TOKENS["cam-2"])


def _report(releases: int = 120, **kw) -> bytes:
    fields = dict(at=1795694855.0, bundle_id="eb-1", mechanism="privunit", epsilon_vector=16.0,
                  epsilon_coordinate=16.0, epsilon_vector_per_release=18.0, track_budget_vector=36.0,
                  device_budget_vector=None, releases=releases, epsilon_vector_spent=2160.0,
                  suppressed={"rate": 40, "budget": 3})  # fmt: skip
    fields.update(kw)
    return DeviceReport(**fields).to_json()  # type: ignore[arg-type]


def test_a_device_reports_over_grpc_and_the_server_keeps_its_latest(fresh):
    stub = fresh.stub()
    book = fresh.services.device_reports
    book.min_interval_s = 0.0
    ack = stub.ReportDevice(
        recognition_pb2.DeviceReportRequest(device_id="cam-1", site=SITE, report=_report(120)), metadata=DEVICE
    )
    assert ack.received_at > 0
    stub.ReportDevice(
        recognition_pb2.DeviceReportRequest(device_id="cam-1", site=SITE, report=_report(121)), metadata=DEVICE
    )
    latest = book.latest()
    assert set(latest) == {"cam-1"}
    rep, at = latest["cam-1"]
    assert rep.releases == 121 and rep.n_suppressed == 43 and at >= ack.received_at
    # what the console's Devices page reads: the gRPC report, next to MQTT's when MQTT is on
    assert fresh.app._device_reports()["cam-1"][0].releases == 121


def test_reports_come_only_from_the_device_they_describe(fresh):
    stub = fresh.stub()
    cases = [
        (dict(device_id="cam-2", site=SITE), DEVICE, grpc.StatusCode.PERMISSION_DENIED,
         "device_id: expected 'cam-1' (the authenticated device), received 'cam-2'"),
        (dict(device_id="cam-1", site="elsewhere"), DEVICE, grpc.StatusCode.PERMISSION_DENIED,
         "site: expected 'lobby' (device cam-1's registered site), received 'elsewhere'"),
        (dict(device_id="cam-1", site=SITE), ADMIN, grpc.StatusCode.PERMISSION_DENIED,
         "ReportDevice: expected the credential of the device the report describes, received the admin credential"),
        (dict(device_id="cam/1", site=SITE), DEVICE, grpc.StatusCode.INVALID_ARGUMENT,
         "device_id: expected a device id of 1-128 characters"),
        (dict(device_id="cam-1", site="x" * 5000), DEVICE, grpc.StatusCode.INVALID_ARGUMENT,
         "site: expected 1-128 characters [A-Za-z0-9_.:@-], received 5000 characters"),
        (dict(device_id="", site="x" * 5000), DEVICE, grpc.StatusCode.INVALID_ARGUMENT,
         "site: expected 1-128 characters"),  # the oversized field is the one named
    ]  # fmt: skip
    for fields, md, code, text in cases:
        got, details = _code(stub.ReportDevice, recognition_pb2.DeviceReportRequest(report=_report(), **fields),
                             metadata=md, timeout=5)  # fmt: skip
        assert got == code and details.startswith(text), details
        assert len(details) < 300
    code, _ = _code(stub.ReportDevice, recognition_pb2.DeviceReportRequest(device_id="cam-1", site=SITE,
                                                                        report=_report()), timeout=5)  # fmt: skip
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert fresh.services.store.device_reports() == {}


def test_malformed_reports_are_refused_naming_the_field(fresh):
    stub = fresh.stub()
    cases = [
        (b"not json", "report: expected a UTF-8 JSON object"),
        (b"[]", "report: expected a JSON object, received list"),
        (b"x" * 3000, "report: expected at most 2048 bytes, received 3000"),
        (_report(releases=-1), "releases: expected a whole number in [0, 1e+15], received -1"),
        (b'{"v":1,"face":"AAAA"}', "report: unknown fields ['face']"),
    ]
    for payload, text in cases:
        code, details = _code(
            stub.ReportDevice,
            recognition_pb2.DeviceReportRequest(device_id="cam-1", site=SITE, report=payload),
            metadata=DEVICE,
            timeout=5,
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details == text, details
    assert fresh.services.store.device_reports() == {}
    # the server still answers
    assert stub.ReportDevice(
        recognition_pb2.DeviceReportRequest(device_id="cam-2", site=SITE, report=_report()), metadata=CAM2
    ).received_at


def test_a_device_cannot_flood_reports(fresh):
    stub = fresh.stub()
    fresh.services.device_reports.min_interval_s = 60.0
    req = recognition_pb2.DeviceReportRequest(device_id="cam-1", site=SITE, report=_report())
    assert stub.ReportDevice(req, metadata=DEVICE, timeout=5).received_at
    code, details = _code(stub.ReportDevice, req, metadata=DEVICE, timeout=5)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.startswith("ReportDevice: expected at most one report per 60 s from device 'cam-1'")
    # another device is not held back by it
    cam2 = recognition_pb2.DeviceReportRequest(device_id="cam-2", site=SITE, report=_report())
    assert stub.ReportDevice(cam2, metadata=CAM2, timeout=5).received_at


class _Store:
    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, bytes, float]] = {}

    def put_device_report(self, device_id: str, site: str, report: bytes, received_at: float) -> None:
        self.rows[device_id] = (site, report, received_at)

    def device_reports(self) -> dict[str, tuple[str, bytes, float]]:
        return dict(self.rows)


def test_the_book_rate_limits_on_its_clock_and_skips_rows_it_cannot_read():
    now = [1000.0]
    book = DeviceReportBook(_Store(), min_interval_s=5.0, clock=lambda: now[0])
    cam = Identity(name="cam-1", is_admin=False, site=None)
    assert book.accept(cam, "cam-1", "any-site", _report()) == 1000.0  # no registered site: the device's own
    now[0] = 1004.9
    with pytest.raises(ReportTooFrequent):
        book.accept(cam, "cam-1", "any-site", _report())
    now[0] = 1005.0
    assert book.accept(cam, "cam-1", "any-site", _report(7)) == 1005.0
    with pytest.raises(PermissionRefused):
        book.accept(None, "cam-1", "any-site", _report())
    book.store.rows["cam-9"] = ("s", b"garbage", 1.0)  # not through accept()
    assert set(book.latest()) == {"cam-1"} and book.latest()["cam-1"][0] == parse_device_report(_report(7))
    with pytest.raises(ValueError, match="min_interval_s"):
        DeviceReportBook(_Store(), min_interval_s=-1)
