"""A camera reaches a returned broker within seconds: its wait between attempts stops doubling at
``mqtt.reconnect_max_s`` (5 s by default). With the earlier ceiling of 60 s, an MQTT camera whose broker was
away for 17 s would try again at 1 + 2 + 4 + 8 + 16 = 31 s, 14 s after the broker returned, its templates
waiting in the spool meanwhile."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from peep.edge.config import MqttConfig
from peep.edge.transport.mqtt import MqttLink
from pydantic import ValidationError


def _client_of(config: MqttConfig):
    return MqttLink(config, client_id="peep-edge-lab-cam-01", site="lab", device_id="cam-01").client


def test_the_wait_between_attempts_to_reach_the_broker_stops_at_reconnect_max_s():
    default = MqttConfig(tls=False)
    assert default.reconnect_max_s == 5
    # paho keeps its doubling wait's bounds on the client (no public getter).
    assert _client_of(default)._reconnect_max_delay == 5
    assert _client_of(default)._reconnect_min_delay == 1
    assert _client_of(MqttConfig(tls=False, reconnect_max_s=30))._reconnect_max_delay == 30


def test_the_shipped_camera_configuration_keeps_the_default_ceiling():
    shipped = tomllib.loads((Path(__file__).parents[2] / "deploy" / "edge" / "edge.toml").read_text())
    assert shipped["mqtt"]["reconnect_max_s"] == MqttConfig.model_fields["reconnect_max_s"].default


def test_a_reconnect_ceiling_out_of_range_is_named():
    with pytest.raises(ValidationError, match="reconnect_max_s"):
        MqttConfig(reconnect_max_s=0)
