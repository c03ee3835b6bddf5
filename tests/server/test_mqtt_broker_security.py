"""The shipped broker configuration (deploy/mosquitto) against misbehaving devices, with the server running.

Our own Mosquitto with the shipped mosquitto.conf, acl and password files
(peep_testing.broker); the server in-process with `mqtt.device_mount_point`.
A device may only write its own templates and status, cannot join the
server's shared subscription, cannot send an oversized message, and what it
leaves retained is cleared or never reaches another device or the status check
of deploy/README.md.
"""

from __future__ import annotations

import signal
import subprocess
import uuid

import pytest
from peep_testing.broker import (
    DEVICE_PASSWORDS,
    SERVER_PASSWORD,
    Client,
    ShippedBroker,
    wait_for,
)
from peep_testing.server import SITE, base_config, start_server

pytestmark = pytest.mark.mqtt


@pytest.fixture
def broker(tmp_path, pki):
    b = ShippedBroker(tmp_path / "broker", pki.client_ca, pki.server_cert, pki.server_key).start()
    yield b
    b.stop(signal.SIGKILL)


@pytest.fixture
def server(tmp_path, pki, keypair, bundle_dir, broker, monkeypatch):
    monkeypatch.setenv("PEEP_TEST_MQTT_PASSWORD", SERVER_PASSWORD)
    mqtt = broker.server_mqtt_section(client_id=f"peep-sec-{uuid.uuid4().hex[:6]}", connections=2)
    cfg = base_config(tmp_path, keypair[3], bundle_dir, mqtt=mqtt)
    cfg["auth"]["allow_insecure"] = True
    srv = start_server(cfg, pki, tmp_path, mqtt_wait=15)
    yield srv
    srv.app.stop(0)


def device(broker: ShippedBroker, name: str) -> Client:
    return Client(broker.dev_port, name, DEVICE_PASSWORDS[name], broker.ca).connect()


def status_check(broker: ShippedBroker, filter_: str, *extra: str) -> list[str]:
    """deploy/README.md's check: mosquitto_sub on the server's listener, as peep-server (retained messages only)."""
    r = subprocess.run(
        ["mosquitto_sub", "-h", "localhost", "-p", str(broker.srv_port), "--cafile", str(broker.ca),
         "-u", "peep-server", "-P", SERVER_PASSWORD, "-V", "mqttv5", "-t", filter_, "-v", "-W", "2",
         "--retained-only", *extra],
        capture_output=True, text=True, errors="replace", timeout=30,
    )  # fmt: skip
    return [line for line in r.stdout.splitlines() if line]


def test_a_device_joining_the_shared_subscription_takes_no_template(broker, server, templates):
    """Before the devices had a listener of their own, cam-2 subscribed to $share/peep-server/… and 8 of 40 of
    cam-1's templates vanished."""
    intruder = device(broker, "cam-2")
    cam1 = device(broker, "cam-1")
    try:
        intruder.subscribe(
            "$share/peep-server/peep/v1/+/+/templates",
            "$share/peep-server/devices/peep/v1/+/+/templates",
            "peep/v1/+/+/templates",
            "#",
        )
        n = 40
        infos = [
            cam1.c.publish(f"peep/v1/{SITE}/cam-1/templates", templates.message(i).SerializeToString(), qos=1)
            for i in range(n)
        ]
        for info in infos:
            info.wait_for_publish(10)
        assert wait_for(lambda: server.services.store.count_received() >= n, 20)
        assert server.services.store.count_received() == n
        assert [t for t, _, _ in intruder.messages if not t.endswith("/bundle")] == []  # a device reads the bundle
    finally:
        intruder.close()
        cam1.close()
    # Device credentials do not open the server's listener (its own password file).
    with pytest.raises(RuntimeError, match="could not connect"):
        Client(broker.srv_port, "cam-2", DEVICE_PASSWORDS["cam-2"], broker.ca).connect(timeout=2)


def test_a_device_writes_only_its_own_templates_and_status(broker, server):
    """The ACL pins the leaf (templates, status) and the device id; not the site (see below)."""
    cam1 = device(broker, "cam-1")
    try:
        allowed = [f"peep/v1/{SITE}/cam-1/status"]
        refused = [
            f"peep/v1/{SITE}/cam-1/parked",
            f"peep/v1/{SITE}/cam-1/events",
            f"peep/v1/{SITE}/cam-1/templates/extra",
            f"peep/v1/{SITE}/cam-2/templates",
            f"peep/v1/{SITE}/cam-2/status",
            "peep/v1/bundle",
            "peep/v1/deadletter",
            "anything/else",
        ]
        mids = {t: cam1.c.publish(t, b"online", qos=1).mid for t in allowed + refused}
        assert wait_for(lambda: all(m in cam1.acks for m in mids.values()), 10)
        codes = {t: cam1.acks[m] for t, m in mids.items()}
        assert all(codes[t] < 0x80 for t in allowed), codes
        assert all(codes[t] == 0x87 for t in refused), codes  # "Not authorized"
    finally:
        cam1.close()


def test_an_oversized_message_is_refused_and_never_retained(broker, server):
    cam1 = device(broker, "cam-1")
    try:
        big = b"x" * (5 * 1024 * 1024)  # over max_packet_size (4 MiB), under the 10 MB of the report
        cam1.c.publish(f"peep/v1/{SITE}/cam-1/status", big, qos=1, retain=True)
        assert wait_for(lambda: bool(cam1.disconnects), 10), "the broker kept the connection"
    finally:
        cam1.c.loop_stop()  # paho would resend it after reconnecting
    retained = status_check(broker, "devices/peep/v1/#", "-F", "%t %l")  # topic and payload length
    assert [line for line in retained if not line.startswith("devices/peep/v1/bundle ")] == []
    assert "too large" in broker.log().lower() or "oversize" in broker.log().lower()


@pytest.mark.slow
def test_what_a_device_retains_is_cleared_and_never_reaches_other_devices_or_the_status_check(
    broker, server, templates
):
    cam1, cam2 = device(broker, "cam-1"), device(broker, "cam-2")
    try:
        cam2.subscribe("#", "peep/v1/#", "peep/v1/+/+/status")
        cam2.c.publish(f"peep/v1/{SITE}/cam-2/status", b"online", qos=1, retain=True).wait_for_publish(10)
        own = templates.message(0).SerializeToString()
        elsewhere = templates.message(1, site="elsewhere").SerializeToString()
        parked = [
            (f"peep/v1/{SITE}/cam-1/templates", own),  # a real template, retained
            ("peep/v1/elsewhere/cam-1/templates", elsewhere),  # the site level the ACL cannot pin
            (f"peep/v1/{SITE}/cam-1/status", b"y" * 100_000),  # not a status
            ("peep/v1/elsewhere/cam-1/status", b"online"),  # not the device's registered site
        ]
        for topic, payload in parked:
            cam1.c.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
        assert wait_for(lambda: server.app.mqtt.retained_cleared >= 4, 15), server.app.mqtt.retained_cleared
        assert wait_for(lambda: server.services.store.count_received() == 1, 10)
        # Other devices read nothing of it (their ACL: own events and the bundle only).
        assert [t for t, _, _ in cam2.messages if not t.endswith("/bundle")] == []
        # The status check of deploy/README.md sees the devices that are online, nothing parked.
        assert wait_for(
            lambda: (
                status_check(broker, "devices/peep/v1/+/+/status") == [f"devices/peep/v1/{SITE}/cam-2/status online"]
            )
        )
        assert status_check(broker, "devices/peep/v1/+/+/templates") == []
    finally:
        cam1.close()
        cam2.close()
    # The template parked under another site was refused: its site is not the device's registered one.
    rejected = server.services.metrics.value(
        "peep_ingest_rejected_total", {"transport": "mqtt", "reason": "wrong_site"}
    )
    assert rejected == 1


def _report(**over) -> bytes:
    from peep.core.reports import DeviceReport

    fields = dict(at=1795694855.0, bundle_id="eb-1", mechanism="privunit", epsilon_vector=16.0,
                  epsilon_coordinate=16.0, epsilon_vector_per_release=18.0, track_budget_vector=36.0,
                  device_budget_vector=None, releases=120, epsilon_vector_spent=2160.0,
                  suppressed={"rate": 40, "budget": 3})  # fmt: skip
    fields.update(over)
    return DeviceReport(**fields).to_json()


def test_a_devices_report_reaches_the_server_and_a_forged_or_bad_one_does_not(broker, server):
    """The retained report (suppressed releases, budgets) a device publishes through the shipped broker: its own
    is kept; another device's topic is refused by the ACL; a malformed one and one under another site are cleared."""
    cam1, cam2 = device(broker, "cam-1"), device(broker, "cam-2")
    try:
        ok = cam1.c.publish(f"peep/v1/{SITE}/cam-1/report", _report(), qos=1, retain=True)
        forged = cam1.c.publish(f"peep/v1/{SITE}/cam-2/report", _report(releases=1), qos=1, retain=True)
        assert wait_for(lambda: ok.mid in cam1.acks and forged.mid in cam1.acks, 10)
        assert cam1.acks[ok.mid] < 0x80 and cam1.acks[forged.mid] == 0x87  # "Not authorized"
        reports = server.app.mqtt.device_reports
        assert wait_for(lambda: "cam-1" in reports(), 10)
        rep, _ = reports()["cam-1"]
        assert rep.releases == 120 and rep.n_suppressed == 43 and rep.track_budget_vector == 36.0
        before = server.app.mqtt.retained_cleared
        bad = b'{"v": 1, "releases": -5, "script": "<b>"}'
        cam2.c.publish(f"peep/v1/{SITE}/cam-2/report", bad, qos=1, retain=True).wait_for_publish(10)
        cam2.c.publish("peep/v1/elsewhere/cam-2/report", _report(), qos=1, retain=True).wait_for_publish(10)
        assert wait_for(lambda: server.app.mqtt.retained_cleared >= before + 2, 15)
        assert "cam-2" not in reports()
        assert wait_for(
            lambda: (
                status_check(broker, "devices/peep/v1/+/+/report", "-F", "%t")
                == [f"devices/peep/v1/{SITE}/cam-1/report"]
            )
        )
    finally:
        cam1.close()
        cam2.close()
