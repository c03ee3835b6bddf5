"""The shipped broker config (deploy/mosquitto): TLS, password auth via make-passwd.sh, per-device ACL."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from peep.core.wire import decode_template
from peep.edge.agent import Agent
from peep.edge.config import load_config
from peep.edge.transport.mqtt import MqttLink

pytestmark = pytest.mark.mqtt

# paho-mqtt 2.2 does not close its SSLSocket when the TLS handshake fails
# (client.py _ssl_wrap_socket); CPython closes it on collection with a
# ResourceWarning. Not ours to fix; only the tests of refused handshakes see it.
paho_tls_leak = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <ssl.SSLSocket:pytest.PytestUnraisableExceptionWarning",
    "ignore:unclosed <ssl.SSLSocket:ResourceWarning",
)


@pytest.fixture
def secure_broker(mosquitto_factory, pki, h, tmp_path):
    """Mosquitto with the shipped mosquitto.conf, acl and make-passwd.sh (paths and ports swapped in).

    ``port`` is the devices' listener (mount point ``devices/``), ``srv_port`` the server's
    (``peep-server`` only), ``mtls_port`` a devices' listener that also requires a client certificate.
    """
    if not os.path.exists(h.MOSQUITTO_PASSWD):
        pytest.skip("mosquitto_passwd not installed (Debian package mosquitto)")
    deploy = h.REPO / "deploy" / "mosquitto"
    etc = tmp_path / "etc"
    etc.mkdir()
    creds = tmp_path / "provisioned"
    out = subprocess.run(
        ["bash", str(deploy / "make-passwd.sh"), str(etc / "passwd"), str(creds), "cam-1", "cam-2=second-device-pw"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "cam-1: password set" in out.stdout
    subprocess.run(
        ["bash", str(deploy / "make-passwd.sh"), str(etc / "passwd-server"), str(creds), "peep-server=server-pw"],
        capture_output=True,
        check=True,
    )
    for name, src in (("ca.pem", pki["ca"]), ("server.pem", pki["server"]), ("server.key", pki["server_key"])):
        (etc / name).write_bytes(src.read_bytes())
    (etc / "acl").write_text((deploy / "acl").read_text())
    srv_port, mtls_port = h.free_port(), h.free_port()
    conf = (deploy / "mosquitto.conf").read_text().replace("/etc/mosquitto/peep/", f"{etc}/")
    broker = mosquitto_factory(persistence=False)
    conf = conf.replace("listener 8883", f"listener {broker.port} 127.0.0.1")
    conf = conf.replace("listener 8884", f"listener {srv_port} 127.0.0.1")
    # A third listener, for devices, that also requires a client certificate.
    conf += (
        f"\nlistener {mtls_port} 127.0.0.1\nmount_point devices/\nallow_anonymous false\n"
        f"password_file {etc}/passwd\nacl_file {etc}/acl\ncafile {etc}/ca.pem\ncertfile {etc}/server.pem\n"
        f"keyfile {etc}/server.key\nrequire_certificate true\n"
    )
    broker.conf.write_text(
        "\n".join(
            line for line in broker.conf.read_text().splitlines() if not line.startswith(("listener", "allow_anon"))
        )
        + "\n"
        + conf
    )
    broker.start()
    return {
        "broker": broker,
        "port": broker.port,
        "srv_port": srv_port,
        "mtls_port": mtls_port,
        "creds": creds,
        "pki": pki,
    }


class Client:
    def __init__(self, port, user, password, *, ca=None, cert=None, key=None, wait=3.0):
        self.wait = wait
        self.events: dict[str, list] = {"pub": [], "msg": [], "conn": []}
        self.connected = threading.Event()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{user}-{time.time_ns()}", protocol=mqtt.MQTTv5)
        self.c.username_pw_set(user, password)
        if ca:
            self.c.tls_set(ca_certs=str(ca), certfile=cert and str(cert), keyfile=key and str(key))
        self.c.on_connect = self._conn
        self.c.on_publish = lambda c, u, mid, rc, p: self.events["pub"].append((mid, rc.value))
        self.c.on_message = lambda c, u, m: self.events["msg"].append((m.topic, bytes(m.payload)))
        self.port = port

    def _conn(self, c, u, f, rc, p):
        self.events["conn"].append(str(rc))
        if not rc.is_failure:
            self.connected.set()

    def __enter__(self):
        try:
            self.c.connect("127.0.0.1", self.port)
        except OSError as exc:
            self.events["conn"].append(f"socket: {exc}")
            return self
        self.c.loop_start()
        deadline = time.monotonic() + self.wait
        while not self.events["conn"] and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.c.disconnect()
        self.c.loop_stop()


def test_device_publishes_over_tls_with_a_systemd_credential_to_the_servers_shared_subscription(
    secure_broker, make_config, crowd_video, h
):
    s = secure_broker
    ca = s["pki"]["ca"]
    cred_dir = s["creds"]
    (cred_dir / "mqtt-password").write_text((cred_dir / "cam-1.mqtt-password").read_text())
    with Client(s["srv_port"], "peep-server", "server-pw", ca=ca) as server:
        assert server.connected.is_set(), server.events
        # The server's listener sees device topics under the devices' mount point.
        server.c.subscribe([("$share/peep/devices/peep/v1/+/+/templates", 1), ("devices/peep/v1/+/+/status", 1)])
        time.sleep(0.3)
        cfg = load_config(
            make_config(
                capture={"source": crowd_video["path"]},
                privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 5.0, "min_track_frames": 2},
                mqtt={
                    "port": s["port"],
                    "host": "localhost",
                    "tls": True,
                    "ca_file": str(ca),
                    "password_credential": "mqtt-password",
                },
            )
        )
        agent = Agent(cfg, environ={"CREDENTIALS_DIRECTORY": str(cred_dir)})
        assert agent.run() == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            t.endswith("/status") and p == b"offline" for t, p in server.events["msg"]
        ):
            time.sleep(0.05)
    templates = [p for t, p in server.events["msg"] if t == "devices/peep/v1/lab/cam-1/templates"]
    assert len(templates) >= 3
    assert all(decode_template(p).device_id == "cam-1" for p in templates)
    statuses = [p for t, p in server.events["msg"] if t == "devices/peep/v1/lab/cam-1/status"]
    assert statuses[0] == b"online" and statuses[-1] == b"offline"


def test_acl_a_device_cannot_publish_or_read_under_another_devices_prefix(secure_broker):
    s = secure_broker
    ca = s["pki"]["ca"]
    pw1 = (s["creds"] / "cam-1.mqtt-password").read_text()
    with (
        Client(s["srv_port"], "peep-server", "server-pw", ca=ca) as server,
        Client(s["port"], "cam-1", pw1, ca=ca) as cam1,
        Client(s["port"], "cam-2", "second-device-pw", ca=ca) as cam2,
    ):
        assert server.connected.is_set() and cam1.connected.is_set() and cam2.connected.is_set()
        server.c.subscribe("$share/peep/devices/peep/v1/+/+/templates", 1)
        cam1.c.subscribe("peep/v1/lab/cam-2/#", 1)  # mosquitto grants, then filters by read ACL
        cam1.c.subscribe("peep/v1/lab/cam-1/events", 1)
        time.sleep(0.3)
        own = cam1.c.publish("peep/v1/lab/cam-1/templates", b"own", qos=1)
        spoof = cam1.c.publish("peep/v1/lab/cam-2/templates", b"spoofed", qos=1)
        spoof_status = cam1.c.publish("peep/v1/lab/cam-2/status", b"offline", qos=1, retain=True)
        cam2.c.publish("peep/v1/lab/cam-2/templates", b"cam2-own", qos=1)
        server.c.publish("devices/peep/v1/lab/cam-1/events", b'{"subject": "x"}', qos=1)
        time.sleep(1.0)
    pubacks = dict(cam1.events["pub"])
    assert pubacks[own.mid] == 0x00
    assert pubacks[spoof.mid] == 0x87 and pubacks[spoof_status.mid] == 0x87  # "Not authorized"
    got = sorted(p for _, p in server.events["msg"])
    assert got == [b"cam2-own", b"own"]
    # cam-1 sees its own events but nothing of cam-2. (Mosquitto 2.0.11 leaves the mount point in
    # the topics it sends to the device; 2.0.12 and later strip it.)
    assert [t.removeprefix("devices/") for t, _ in cam1.events["msg"]] == ["peep/v1/lab/cam-1/events"]


@pytest.mark.slow
@paho_tls_leak
def test_wrong_password_plaintext_and_untrusted_broker_are_refused(secure_broker, pki):
    s = secure_broker
    with Client(s["port"], "cam-1", "wrong", ca=pki["ca"]) as bad:
        pass
    assert not bad.connected.is_set() and set(bad.events["conn"]) == {"Not authorized"}
    with Client(s["port"], "cam-2", "second-device-pw", wait=1.0) as plain:  # no TLS to the TLS listener
        pass
    assert not plain.connected.is_set()
    # The agent's link pinned to another CA never connects (certificate verification fails).
    from peep.edge.config import MqttConfig

    link = MqttLink(
        MqttConfig(host="localhost", port=s["port"], tls=True, ca_file=pki["other_ca"]),
        client_id="pinned",
        site="lab",
        device_id="cam-2",
        password="second-device-pw",
    )
    link.start()
    try:
        assert not link.wait_connected(1.5)
    finally:
        link.stop()


@paho_tls_leak
def test_mutual_tls_listener_requires_the_client_certificate(secure_broker, pki):
    from peep.edge.config import MqttConfig

    s = secure_broker
    with_cert = MqttLink(
        MqttConfig(
            host="localhost",
            port=s["mtls_port"],
            tls=True,
            ca_file=pki["ca"],
            cert_file=pki["client"],
            key_file=pki["client_key"],
        ),
        client_id="mtls-ok",
        site="lab",
        device_id="cam-2",
        password="second-device-pw",
    )
    without = MqttLink(
        MqttConfig(host="localhost", port=s["mtls_port"], tls=True, ca_file=pki["ca"]),
        client_id="mtls-no",
        site="lab",
        device_id="cam-2",
        password="second-device-pw",
    )
    with_cert.start()
    without.start()
    try:
        assert with_cert.wait_connected(5.0)
        assert not without.wait_connected(1.5)
    finally:
        with_cert.stop()
        without.stop()


@pytest.mark.slow
def test_templates_refused_by_the_broker_stay_in_the_spool(secure_broker, make_config, crowd_video, caplog):
    """Credentials of another device: the ACL refuses every PUBACK (0x87) and nothing leaves the spool."""
    import logging

    from peep.edge.spool import Spool

    caplog.set_level(logging.ERROR, logger="peep")
    s = secure_broker
    cfg = load_config(
        make_config(
            capture={"source": crowd_video["path"], "max_fps": 50.0},
            privacy={"epsilon": 4.0, "track_budget": 1e6, "window_seconds": 5.0, "min_track_frames": 2},
            mqtt={
                "port": s["port"],
                "host": "localhost",
                "tls": True,
                "ca_file": str(s["pki"]["ca"]),
                "username": "cam-2",
                "password_env": "PW",
                "reconnect_min_s": 1,
                "reconnect_max_s": 1,
            },
            spool={"drain_timeout_s": 1.0},
        )
    )
    agent = Agent(cfg, environ={"PW": "second-device-pw"})
    assert agent.run() == 0
    assert any(r.msg == "mqtt_publish_refused" and "Not authorized" in str(r.__dict__) for r in caplog.records)
    released = agent.metrics.value("peep_edge_releases_total", purpose="identify")
    assert released >= 3
    assert agent.metrics.value("peep_edge_published_total", transport="mqtt") == 0
    with Spool(cfg.spool_path, destinations=["mqtt"]) as spool:
        assert spool.depth("mqtt") == released
