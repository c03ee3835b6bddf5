"""Listing and clearing retained messages on a broker (what a one-off run leaves behind).

A retained message stays on the broker until someone replaces it with an empty retained message.
The benchmark, the demo and the tests announce bundles and statuses retained under topic roots of
their own; they clear them with :func:`clear_retained` when they are done, and check with
:func:`retained_topics` that nothing remains. Both connect with a clean MQTT v5 session (clean
start, session expiry 0): they leave no session either. For a broker without authentication
(the loopback broker of the demo, the benchmark and CI).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion


def _client(purpose: str) -> mqtt.Client:
    # MQTT v5 defaults: clean start, session expiry 0 (the session ends with the connection).
    return mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"peep-{purpose}-{uuid.uuid4().hex[:10]}",
                       protocol=mqtt.MQTTv5)  # fmt: skip


def retained_topics(
    topic_filter: str, host: str = "127.0.0.1", port: int = 1883, *, quiet_s: float = 0.5, timeout_s: float = 10.0
) -> dict[str, bytes]:
    """``{topic: payload}`` of every retained message matching ``topic_filter``.

    The broker sends the retained messages right after the subscription; the listing ends once
    nothing arrived for ``quiet_s``. Raises ``TimeoutError`` when the broker does not acknowledge
    the subscription within ``timeout_s``.
    """
    found: dict[str, bytes] = {}
    last = [time.monotonic()]
    subscribed = threading.Event()
    c = _client("list")

    def on_message(client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.retain and msg.payload:
            found[msg.topic] = bytes(msg.payload)
        last[0] = time.monotonic()

    def on_subscribe(*args: Any) -> None:
        last[0] = time.monotonic()
        subscribed.set()

    c.on_message = on_message
    c.on_subscribe = on_subscribe
    c.connect(host, port)
    c.loop_start()
    try:
        c.subscribe(topic_filter, qos=0)
        if not subscribed.wait(timeout_s):
            raise TimeoutError(f"mqtt: {host}:{port} did not acknowledge a subscription to {topic_filter!r}")
        while time.monotonic() - last[0] < quiet_s:
            time.sleep(0.05)
    finally:
        c.disconnect()
        c.loop_stop()
    return found


def clear_retained(topics: list[str], host: str = "127.0.0.1", port: int = 1883, *, timeout_s: float = 10.0) -> None:
    """Clear the retained message of each of ``topics`` (an empty retained message, QoS 1, acknowledged)."""
    if not topics:
        return
    c = _client("clear")
    c.connect(host, port)
    c.loop_start()
    try:
        infos = [c.publish(t, b"", qos=1, retain=True) for t in topics]
        for info in infos:
            info.wait_for_publish(timeout_s)
    finally:
        c.disconnect()
        c.loop_stop()
