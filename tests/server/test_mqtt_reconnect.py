"""The server reaches a returned broker within seconds: its wait between attempts stops doubling at
``mqtt.reconnect_max_s`` (5 s by default). With the earlier ceiling of 30 s, a broker away for 17 s in the soak
was reached again 14 s after it came back, past the soak's recovery limit of 15 s."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from peep.server.config.transports import MqttConfig
from peep.server.transport.mqtt import MqttBridge
from pydantic import ValidationError


def _client_of(config: MqttConfig):
    bridge = SimpleNamespace(config=config, connection_client_id=lambda i: f"{config.client_id}-{i}")
    return MqttBridge._bare_client(bridge, 0, None)  # type: ignore[arg-type]


def test_the_wait_between_attempts_to_reach_the_broker_stops_at_reconnect_max_s():
    default = MqttConfig(enabled=True)
    assert default.reconnect_max_s == 5
    # paho keeps its doubling wait's bounds on the client (no public getter).
    assert _client_of(default)._reconnect_max_delay == 5
    assert _client_of(default)._reconnect_min_delay == 1
    assert _client_of(MqttConfig(enabled=True, reconnect_max_s=20))._reconnect_max_delay == 20


def test_a_reconnect_ceiling_out_of_range_is_named():
    with pytest.raises(ValidationError, match="reconnect_max_s"):
        MqttConfig(enabled=True, reconnect_max_s=0)
