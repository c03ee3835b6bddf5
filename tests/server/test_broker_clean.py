"""Nothing is left on the shared broker (127.0.0.1:1883) by the benchmark or the test suite.

A retained message stays until someone clears it, a persistent session until it expires: every
`peep bench` and several tests used to leave a retained 1.5 MB bundle under a unique topic root
(20 of them, 19.7 MB, after a day). Each test lists the broker's retained topics before and after.
The suite-wide check is the session fixture `_broker_left_clean` in conftest.py.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from peep.lab.processes.retained import clear_retained, retained_topics
from peep_testing.server import base_config, mqtt_available, start_server

pytestmark = pytest.mark.mqtt


@pytest.fixture(scope="module", autouse=True)
def _broker():
    reason = mqtt_available()
    if reason:
        pytest.skip(reason)


def session_present(client_id: str) -> bool:
    """Whether the broker holds a session for ``client_id`` (the probe itself leaves none: expiry 0)."""
    state: dict[str, bool] = {}
    up = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)

    def on_connect(cl: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        state["present"] = bool(flags.session_present)
        up.set()

    c.on_connect = on_connect
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = 0
    c.connect("127.0.0.1", 1883, clean_start=False, properties=props)
    c.loop_start()
    try:
        assert up.wait(10), "no CONNACK"
    finally:
        c.disconnect()
        c.loop_stop()
    return state["present"]


def test_a_server_leaves_its_bundle_retained_and_clear_retained_removes_it(tmp_path, pki, keypair, bundle_dir):
    """What the suite's clean-up relies on: a server's announcement stays after it stops, until cleared."""
    root = f"peeptest-clean-{uuid.uuid4().hex[:10]}/v1"
    before = retained_topics("#")
    assert not any(t.startswith(root + "/") for t in before)
    cfg = base_config(
        tmp_path, keypair[3], bundle_dir,
        mqtt={"enabled": True, "topic_prefix": root, "share_group": f"g{uuid.uuid4().hex[:8]}"},
    )  # fmt: skip
    cfg["auth"]["allow_insecure"] = True
    srv = start_server(cfg, pki, tmp_path, mqtt_wait=10)
    client_id = srv.app.config.mqtt.client_id
    srv.app.stop(0)
    left = retained_topics(f"{root}/#")
    assert list(left) == [f"{root}/bundle"] and len(left[f"{root}/bundle"]) > 1000  # the BundleFiles message
    clear_retained(list(left))
    after = retained_topics("#")
    assert not any(t.startswith(root + "/") for t in after), sorted(after)
    assert not session_present(client_id)  # session expiry 0: the session ended with the connection


@pytest.mark.slow
def test_bench_mqtt_leaves_no_retained_message_or_session(tmp_path):
    from peep.lab.bench import server as bench
    from peep.lab.bench.server_clients import write_frames
    from peep.lab.processes.pki import make_local_pki

    bundle, pub = bench.synthetic_bundle(tmp_path)
    bundle.bench_dir = str(tmp_path / "bundle")
    tls = make_local_pki(tmp_path / "tls")
    devices = ["dev-0", "dev-1"]
    files = []
    for d in devices:
        f = tmp_path / f"{d}.bin"
        write_frames(f, bench.synthetic_templates(bundle, 100, devices=[d]))
        files.append(str(f))
    before = retained_topics("#")
    run = bench._bench_mqtt(tmp_path, bundle, pub, tls, files, devices, 100, [])
    after = retained_topics("#")
    root = run["prefix"]
    assert run["stored"] == 200 and run["lost"] == 0
    assert not any(t.startswith(root + "/") for t in before)
    assert not any(t.startswith(root + "/") for t in after), sorted(t for t in after if t.startswith(root))
    cid = run["client_id"]
    ids = [cid] + [f"{cid}-{i}" for i in range(1, run["connections"])]
    assert [i for i in ids if session_present(i)] == []
