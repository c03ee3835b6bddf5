"""An injected template opens no door, locks nobody out and is counted as nobody's release.

The attack, against a real server and a real door deciding over MQTT: a client the broker lets publish (the
shared open broker with ``door.insecure_broker = true``; a TLS broker of our own that takes any client)
records the door's genuine VERIFY template of an enrolled person, then, the moment the door asks its claim
question (the nonce in the clear on ``<root>/<site>/<door>/claims``), re-publishes a recorded template under
that nonce on the door's templates topic, before the door's own. Against an impostor's claim it re-publishes
the genuine face (to open the door); against the genuine person's claims, an impostor's rejected face (to
lock them out). Each injection is sent twice: with the recorded device signature and claim ticket, and
stripped of both.
"""

from __future__ import annotations

import json
import signal
import threading
import uuid
from typing import Any

import numpy as np
import pytest
from peep_testing.door import frames
from peep_testing.server import ADMIN, MQTT_PREFIX, SITE, base_config, mqtt_available, start_server, tls_section

pytestmark = [pytest.mark.slow, pytest.mark.mqtt]

DOOR = "cam-1"
IMPOSTOR_CLAIMS = 3
GENUINE_CLAIMS = 6  # more than door.lockout_failures (5): six injected refusals would lock the person out


@pytest.fixture(params=["open_broker", "tls_broker_any_client"])
def any_client_broker(request, tmp_path, pki):
    """Where anyone may publish anything: the shared anonymous broker, or a TLS broker that checks no one."""
    if request.param == "open_broker":
        why = mqtt_available()
        if why:
            pytest.skip(why)
        yield {"host": "127.0.0.1", "port": 1883, "ca": None}
        return
    from peep_testing.broker import Mosquitto

    conf = (f"listener {{port}} 127.0.0.1\ncafile {pki.client_ca}\ncertfile {pki.server_cert}\n"
            f"keyfile {pki.server_key}\nrequire_certificate false\n")  # fmt: skip
    b = Mosquitto(tmp_path / "tls-broker", conf, persistence=False).start()
    yield {"host": "localhost", "port": b.port, "ca": pki.client_ca}
    b.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def faces(tmp_path_factory, lfw100, data_home):
    """Videos of an enrolled person (a held-out photo) and of someone never enrolled, at the door camera."""
    from peep.edge.testing import FaceTrack, compose_video, lfw_people

    people = lfw_people(data_home)
    name = lfw100.target_names[int(np.bincount(lfw100.labels).argmax())].replace(" ", "_")
    enrolled = {n.replace(" ", "_") for n in lfw100.target_names}
    stranger = next(n for n in sorted(people) if n not in enrolled and len(people[n]) >= 2)
    out = tmp_path_factory.mktemp("injection")
    videos = {}
    for who, photo in (("genuine", people[name][-1]), ("impostor", people[stranger][0])):
        path = out / f"{who}.mp4"
        compose_video(path, [FaceTrack(image=photo, start=0, stop=40, x0=200, y0=120, amplitude=10,
                                       period_frames=40)], n_frames=40, fps=10.0)  # fmt: skip
        videos[who] = str(path)
    return name, videos


class Injector:
    """The attacker: anonymous on the broker, reading the door's claims and templates, injecting on its topic."""

    def __init__(self, broker: dict[str, Any]) -> None:
        import paho.mqtt.client as mqtt

        self.recorded: list[bytes] = []  # what the door itself released
        self.sent: list[bytes] = []  # what this client injected
        self.payload: bytes | None = None  # the recorded template to inject at the next claim question
        self._lock = threading.Lock()
        self.claims = f"{MQTT_PREFIX}/{SITE}/{DOOR}/claims"
        self.templates = f"{MQTT_PREFIX}/{SITE}/{DOOR}/templates"
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"intruder-{uuid.uuid4().hex[:6]}",
                             protocol=mqtt.MQTTv5)  # fmt: skip
        if broker["ca"] is not None:
            self.c.tls_set(ca_certs=str(broker["ca"]))
            self.c.username_pw_set("anyone", "anything")
        ready = threading.Event()
        self.c.on_subscribe = lambda *a: ready.set()
        self.c.on_message = self._on_message
        self.c.connect(broker["host"], broker["port"])
        self.c.subscribe([(self.claims, 0), (self.templates, 1)])
        self.c.loop_start()
        assert ready.wait(10)

    def _on_message(self, c: Any, u: Any, m: Any) -> None:
        from peep.core.wire import decode_template

        if m.topic == self.templates:
            with self._lock:
                if bytes(m.payload) not in self.sent:
                    self.recorded.append(bytes(m.payload))
            return
        with self._lock:
            payload = self.payload
        if payload is None:
            return
        nonce = json.loads(m.payload)["nonce"]
        for strip in (False, True):
            forged = decode_template(payload)
            forged.message_id = nonce  # the live claim's nonce: what the server's decision names
            if strip:
                forged.ClearField("device_signature")
                forged.ClearField("claim_signature")
            raw = forged.SerializeToString()
            with self._lock:
                self.sent.append(raw)
            c.publish(self.templates, raw, qos=1)

    def arm(self, payload: bytes | None) -> None:
        with self._lock:
            self.payload = payload

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def test_an_injected_template_opens_no_door_locks_nobody_out_and_counts_as_no_release(
    any_client_broker, tmp_path, pki, keypair, bundle_dir, templates, decision_keys, faces, monkeypatch
):
    from gpiozero.pins.mock import MockFactory
    from peep.core.wire import decode_template, template_digest
    from peep.edge.agent import Agent
    from peep.edge.config import load_config
    from peep.edge.device_key import DeviceKey
    from peep.edge.door_session import open_door
    from peep.v1 import recognition_pb2
    from peep_testing.server import write_edge_config

    broker = any_client_broker
    tls = broker["ca"] is not None
    name, videos = faces
    mqtt_edge = {"enabled": True, "host": broker["host"], "port": broker["port"], "tls": tls,
                 "topic_prefix": MQTT_PREFIX, "reconnect_max_s": 1}  # fmt: skip
    if tls:  # a password the broker never checks: the door sees TLS and credentials, the broker lets anyone in
        mqtt_edge.update(ca_file=str(broker["ca"]), password_env="DOOR_MQTT_PASSWORD")
    edge_path = write_edge_config(
        tmp_path / "door.toml", port=1, pki=pki, bundle_dir=bundle_dir, pub_path=keypair[3], device_id=DOOR,
        privacy={"mechanism": "peep-raw", "epsilon": 8.0, "track_budget": 1e6}, grpc={"enabled": False},
        mqtt=mqtt_edge,
        door={"enabled": True, "decision": "mqtt", "decision_public_key": str(decision_keys[3]),
              "insecure_broker": not tls, "decision_timeout_s": 6.0, "open_s": 0.05, "epsilon_per_hour": 1e6,
              "subject_epsilon_per_hour": 1e6, "max_claims_per_minute": 60},
    )  # fmt: skip
    edge_cfg = load_config(edge_path)
    server_mqtt = {"enabled": True, "host": broker["host"], "port": broker["port"], "username": None,
                   "share_group": f"g{uuid.uuid4().hex[:8]}", "client_id": f"srv-{uuid.uuid4().hex[:8]}",
                   "decision_signing_key": str(decision_keys[2])}  # fmt: skip
    if tls:
        server_mqtt["tls"] = {"ca": str(broker["ca"])}
    cfg = base_config(tmp_path, keypair[3], bundle_dir, mqtt=server_mqtt, grpc={"tls": tls_section(pki)})
    # The door's signing key (made in its state folder), registered as `peep-edge device-key` prints it.
    cfg["auth"]["devices"][0]["signing_key"] = DeviceKey(edge_cfg.device_key_path).public_text
    srv = start_server(cfg, pki, tmp_path, mqtt_wait=15)
    stub = srv.stub()
    assert stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60).rejected == 0
    assert stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300).model_version == "v000001"
    store = srv.services.store
    before = store.count_received()
    agent = Agent(edge_cfg, environ={"DOOR_MQTT_PASSWORD": "not-checked"})
    outcomes: list = []
    rig = open_door(agent, pin_factory=MockFactory(), on_outcome=outcomes.append, face_timeout_s=5.0)
    intruder = Injector(broker)
    try:
        assert rig.link is not None and rig.link.wait_connected(10)

        def claim(who: str) -> Any:
            return rig.session.handle(name, frames(videos[who]))

        # 1. The genuine person at the door: the intruder records the VERIFY template it releases.
        first = claim("genuine")
        assert first.reason in ("", "rejected"), first  # decided by the server, whichever way
        genuine = intruder.recorded[-1]
        # 2. An impostor claims the genuine person's id; the recorded genuine face is injected under each nonce.
        intruder.arm(genuine)
        opened_before = rig.controller.opened
        impostor = [claim("impostor") for _ in range(IMPOSTOR_CLAIMS)]
        opened_for_impostor = rig.controller.opened - opened_before  # by any path: the events topic too
        rejected_face = intruder.recorded[-1]  # the impostor's own face, which the server refused
        # 3. The genuine person claims while the impostor's rejected face is injected under each nonce.
        intruder.arm(rejected_face)
        genuine_claims = [claim("genuine") for _ in range(GENUINE_CLAIMS)]
        intruder.arm(None)
        last = claim("genuine")
    finally:
        intruder.close()
        rig.close()
        agent.shutdown(drain_timeout=0)
    try:
        injected = len(intruder.sent)
        assert injected == 2 * (IMPOSTOR_CLAIMS + GENUINE_CLAIMS)
        # No door opened for the impostor: each claim was decided on the impostor's own face.
        assert opened_for_impostor == 0 and not any(o.opened for o in impostor), [o.reason for o in impostor]
        # Nobody was locked out: the refusals the door counted are the server's decisions on its own templates.
        assert rig.controller.refusals["locked_out"] == 0 and last.reason != "locked_out", last
        own = [decode_template(p) for p in intruder.recorded]
        assert len(own) == 2 + IMPOSTOR_CLAIMS + GENUINE_CLAIMS  # every claim released once, the door's own
        # No injected release counted: the server holds exactly the door's own releases, and refused the rest.
        assert store.count_received() - before == len(own)
        m = srv.services.metrics
        refused = sum(
            m.value("peep_ingest_rejected_total", {"transport": "mqtt", "reason": r}) or 0
            for r in ("bad_signature", "unsigned", "unasked_claim")
        )
        assert refused == injected
        digests = {template_digest(t) for t in own}
        decided = [o for o in [first, *impostor, *genuine_claims, last] if o.reason in ("", "rejected")]
        opened = sum(o.opened for o in [*genuine_claims, last])
        print(f"injected {injected} templates: refused {refused}, doors opened for the impostor "
              f"{opened_for_impostor}, lock-outs {rig.controller.refusals['locked_out']}, genuine "
              f"claims opened {opened} of {len(genuine_claims) + 1}, decisions on the door's own templates "
              f"{len(decided)}, releases counted {store.count_received() - before} of {len(own)} "
              f"({len(digests)} digests)")  # fmt: skip
    finally:
        srv.app.stop(0)
