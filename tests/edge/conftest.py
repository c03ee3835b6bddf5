"""Fixtures for the edge agent: a small signed bundle, real LFW videos, brokers, certificates.

Real parts only: videos are composed from LFW images (faces moving over a
640x480 background), bundles are signed and verified, Mosquitto is the real
broker (the system one at 127.0.0.1:1883, or our own on a free port for
TLS/ACL and kill/restart tests).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from peep.lab.processes.control import port_open
from peep.lab.processes.ports import free_port
from peep_testing.broker import Mosquitto
from peep_testing.edge import EDGE_SITE

REPO = Path(__file__).resolve().parents[2]
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"

# `.venv/bin/python -m pytest tests/edge` should work without the test.sh
# wrapper when the LFW copy is staged in the usual place.
_staged = REPO / ".data" / "scikit_learn_data"
if not os.environ.get("SCIKIT_LEARN_DATA") and (_staged / "lfw_home" / "lfw_funneled").is_dir():
    os.environ["SCIKIT_LEARN_DATA"] = str(_staged)


# --------------------------------------------------------------------------- bundle


@pytest.fixture(scope="session")
def edge_keys(tmp_path_factory: pytest.TempPathFactory):
    from peep.core.bundle import load_private_key, load_public_key, write_keypair

    d = tmp_path_factory.mktemp("edge-keys")
    key_path, pub_path = write_keypair(d / "site")
    other_key, other_pub = write_keypair(d / "other")
    return {
        "private": load_private_key(key_path),
        "public": load_public_key(pub_path),
        "key_path": key_path,
        "pub_path": pub_path,
        "other_private": load_private_key(other_key),
        "other_pub_path": other_pub,
    }


def build_edge_bundle(
    dataset: Any,
    signing_key: Any,
    out: Path,
    *,
    n_components: int = 64,
    n_faces: int = 600,
    mechanism_defaults: dict[str, Any] | None = None,
    created_at: float | None = None,
) -> Path:
    """A signed bundle from the background population (core only; nc=64 keeps tests fast)."""
    from peep.core.bundle import build_bundle_files, write_bundle_files
    from peep.core.imaging import FaceGeometry
    from peep.core.projections import EigenfaceProjection

    X = np.asarray(dataset.X[:n_faces], dtype=np.float64)
    files = build_bundle_files(
        projection=EigenfaceProjection(n_components=n_components).fit(X),
        geometry=FaceGeometry.from_dict(dataset.normalisation["geometry"]),
        signing_key=signing_key,
        normalisation=dataset.normalisation,
        mechanism_defaults=mechanism_defaults or {"kind": "peep", "epsilon": 8.0, "delta": 0.0},
        provenance={"dataset": "lfw background (edge tests)", "n_images": int(X.shape[0])},
        created_at=created_at,
    )
    return write_bundle_files(files, out)


@pytest.fixture(scope="session")
def edge_bundle_dir(tmp_path_factory, lfw_background, edge_keys) -> Path:
    return build_edge_bundle(lfw_background, edge_keys["private"], tmp_path_factory.mktemp("edge-bundle"))


@pytest.fixture(scope="session")
def edge_bundle(edge_bundle_dir, edge_keys):
    from peep.core.bundle import ProjectionBundle

    return ProjectionBundle.load(edge_bundle_dir, edge_keys["public"])


# --------------------------------------------------------------------------- videos


@pytest.fixture(scope="session")
def people(data_home) -> dict[str, list[Path]]:
    """LFW people with >= 20 images (disjoint from the bundle's background population)."""
    from peep.edge.testing import lfw_people

    return lfw_people(data_home, min_images=20)


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("videos")


@pytest.fixture(scope="session")
def one_person_video(people, video_dir) -> dict[str, Any]:
    """60 s of one person moving slowly (5 fps, 300 frames)."""
    from peep.edge.testing import FaceTrack, compose_video

    name = sorted(people)[0]
    track = FaceTrack(image=people[name][0], start=0, stop=300, x0=200, y0=130, amplitude=120, period_frames=100)
    info = compose_video(video_dir / "one_person.mp4", [track], n_frames=300, fps=5.0)
    info["person"] = name
    return info


@pytest.fixture(scope="session")
def crowd_video(people, video_dir) -> dict[str, Any]:
    """20 s at 10 fps: person A throughout, B from 2 s to 14 s, C from 8 s to 20 s."""
    from peep.edge.testing import FaceTrack, compose_video

    names = sorted(people)[1:4]
    tracks = [
        FaceTrack(image=people[names[0]][0], start=0, stop=200, x0=30, y0=20, amplitude=25, period_frames=80),
        FaceTrack(
            image=people[names[1]][0], start=20, stop=140, x0=420, y0=20, amplitude=25, period_frames=90, phase=1.0
        ),
        FaceTrack(
            image=people[names[2]][0], start=80, stop=200, x0=230, y0=270, amplitude=30, period_frames=100, phase=2.0
        ),
    ]
    info = compose_video(video_dir / "crowd.mp4", tracks, n_frames=200, fps=10.0)
    info["people"] = names
    return info


# --------------------------------------------------------------------------- config


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, Path):
        v = str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(type(v))


def to_toml(data: dict[str, dict[str, Any]]) -> str:
    out = []
    for section, values in data.items():
        out.append(f"[{section}]")
        for k, v in values.items():
            if v is not None:
                out.append(f"{k} = {toml_value(v)}")
        out.append("")
    return "\n".join(out)


@pytest.fixture
def make_config(tmp_path, edge_bundle_dir, edge_keys) -> Callable[..., Path]:
    """Write an edge.toml; ``make_config(privacy={...}, mqtt={...})`` overrides keys per section."""

    def make(name: str = "edge.toml", **sections: dict[str, Any]) -> Path:
        base: dict[str, dict[str, Any]] = {
            "device": {"id": "cam-1", "site": "lab", "state_dir": str(tmp_path / "state")},
            "bundle": {"path": str(edge_bundle_dir), "public_key": str(edge_keys["pub_path"])},
            "privacy": {"mechanism": "peep", "epsilon": 4.0, "track_budget": 10_000.0},
            "capture": {"source": str(tmp_path), "max_fps": 0.0},
            "mqtt": {"host": "127.0.0.1", "port": 1883, "tls": False},
            "metrics": {"port": 0},
            "log": {"level": "info", "format": "json"},
        }
        for section, values in sections.items():
            base.setdefault(section, {}).update(values)
        path = tmp_path / name
        path.write_text(to_toml(base))
        return path

    return make


# --------------------------------------------------------------------------- brokers


def _retained(host: str, port: int, topic_filter: str) -> set[str]:
    """Topics under ``topic_filter`` holding a retained message (clean session: nothing is left by asking)."""
    import paho.mqtt.client as mqtt

    found: set[str] = set()
    subscribed = threading.Event()
    last = [time.monotonic()]
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"edgetest-list-{uuid.uuid4().hex[:8]}",
                    protocol=mqtt.MQTTv5)  # fmt: skip

    def on_message(cl: Any, u: Any, msg: Any) -> None:
        if msg.retain and msg.payload:
            found.add(msg.topic)
        last[0] = time.monotonic()

    c.on_message = on_message
    c.on_subscribe = lambda *a: subscribed.set()
    c.connect(host, port)
    c.loop_start()
    try:
        c.subscribe(topic_filter, qos=0)
        assert subscribed.wait(10), "no SUBACK"
        while time.monotonic() - last[0] < 0.5:
            time.sleep(0.05)
    finally:
        c.disconnect()
        c.loop_stop()
    return found


@pytest.fixture(scope="session")
def system_broker() -> Iterator[tuple[str, int]]:
    """The shared broker; the agents' retained statuses (``offline`` on a clean stop) under
    ``peep/v1/<EDGE_SITE>`` that appeared during the session are cleared at its end."""
    if not port_open(1883):
        pytest.skip("no Mosquitto listening on 127.0.0.1:1883 (the CI service); start it to run this test")
    host, port = "127.0.0.1", 1883
    before = _retained(host, port, f"peep/v1/{EDGE_SITE}/#")
    yield (host, port)
    new = sorted(_retained(host, port, f"peep/v1/{EDGE_SITE}/#") - before)
    import paho.mqtt.client as mqtt

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"edgetest-clear-{uuid.uuid4().hex[:8]}",
                    protocol=mqtt.MQTTv5)  # fmt: skip
    c.connect(host, port)
    c.loop_start()
    try:
        for info in [c.publish(t, b"", qos=1, retain=True) for t in new]:
            info.wait_for_publish(10)
    finally:
        c.disconnect()
        c.loop_stop()
    left = _retained(host, port, f"peep/v1/{EDGE_SITE}/#") & set(new)
    assert not left, f"retained statuses left on the broker: {sorted(left)}"


@pytest.fixture
def mosquitto_factory(tmp_path) -> Iterator[Callable[..., Mosquitto]]:
    brokers: list[Mosquitto] = []

    def make(conf_body: str = "", **kw: Any) -> Mosquitto:
        b = Mosquitto(tmp_path / f"broker{len(brokers)}", conf_body, **kw)
        brokers.append(b)
        return b

    yield make
    for b in brokers:
        b.stop(signal.SIGKILL)


class Collector:
    """A paho v5 subscriber recording every payload per topic (raw, duplicates included)."""

    def __init__(
        self,
        host: str,
        port: int,
        topics: list[str],
        *,
        client_id: str | None = None,
        persistent: bool = False,
        username: str | None = None,
        password: str | None = None,
        tls_ca: Path | None = None,
    ) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.messages: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.topics = topics
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id or f"collector-{time.time_ns()}", protocol=mqtt.MQTTv5
        )
        if username:
            self.client.username_pw_set(username, password)
        if tls_ca:
            self.client.tls_set(ca_certs=str(tls_ca))
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda *a: self.connected.clear()
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.1, 0.5)  # type: ignore[arg-type]
        props = None
        if persistent:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 600
        self.client.connect_async(host, port, keepalive=10, clean_start=not persistent, properties=props)
        self.client.loop_start()
        if not self.connected.wait(10):
            raise RuntimeError("collector could not connect")

    def _on_connect(self, client, userdata, flags, rc, props) -> None:
        if rc.is_failure:
            return
        client.subscribe([(t, 1) for t in self.topics])
        time.sleep(0.1)
        self.connected.set()

    def _on_message(self, client, userdata, msg) -> None:
        with self.lock:
            self.messages.append((msg.topic, bytes(msg.payload), bool(msg.retain)))

    def payloads(self, suffix: str = "/templates") -> list[bytes]:
        with self.lock:
            return [p for t, p, _ in self.messages if t.endswith(suffix)]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return predicate()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def collector_factory() -> Iterator[Callable[..., Collector]]:
    made: list[Collector] = []

    def make(*args: Any, **kw: Any) -> Collector:
        c = Collector(*args, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


# --------------------------------------------------------------------------- PKI


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate (PEM files; the lab's PKI)."""
    from peep.lab.processes.pki import LocalCA

    d = tmp_path_factory.mktemp("pki")
    ca = LocalCA("peep test CA", days=2)
    out = {"ca": ca.write_ca(d / "ca.pem")}
    out["server"], out["server_key"] = ca.issue_server(("localhost",)).write(d / "server.pem", d / "server.key")
    out["client"], out["client_key"] = ca.issue_client("cam-1").write(d / "client.pem", d / "client.key")
    # A second, unrelated CA: a device pinned to it must refuse the broker.
    out["other_ca"] = LocalCA("some other CA", days=2).write_ca(d / "other-ca.pem")
    return out


# --------------------------------------------------------------------------- helpers


def decode_all(payloads: list[bytes]) -> list[Any]:
    from peep.core.wire import decode_template

    return [decode_template(p) for p in payloads]


def run_agent_in_thread(agent: Any, source: Any = None) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["rc"] = agent.run(source=source)
        except BaseException as exc:  # surfaced by the test
            result["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, result


@pytest.fixture(scope="session")
def h():
    """Helper functions for tests (conftest modules are not importable with --import-mode=importlib)."""
    import types

    return types.SimpleNamespace(
        decode_all=decode_all,
        run_agent_in_thread=run_agent_in_thread,
        free_port=free_port,
        port_open=port_open,
        build_edge_bundle=build_edge_bundle,
        to_toml=to_toml,
        Mosquitto=Mosquitto,
        MOSQUITTO_PASSWD=MOSQUITTO_PASSWD,
        REPO=REPO,
    )
