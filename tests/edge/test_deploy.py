"""deploy/ files for the edge: the systemd unit and the example config agree with the agent."""

from __future__ import annotations

import configparser
from pathlib import Path

from peep.edge.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string((DEPLOY / "systemd" / "peep-edge.service").read_text())
    return cp


def test_unit_runs_unprivileged_restarts_on_failure_and_outlasts_the_drain():
    svc = unit()["Service"]
    assert svc["User"] == "peep-edge" and svc["User"] != "root"
    assert svc["Restart"] == "on-failure"
    assert svc["RestartPreventExitStatus"] == "2"  # config errors are not retried
    assert "--config /etc/peep-edge/edge.toml" in svc["ExecStart"]
    assert svc["LoadCredential"].startswith("mqtt-password:")
    assert svc["NoNewPrivileges"] == "yes" and svc["CapabilityBoundingSet"] == ""
    cfg = load_config(DEPLOY / "edge" / "edge.toml")
    assert cfg.mqtt.password_credential == "mqtt-password"
    assert int(svc["TimeoutStopSec"]) > cfg.spool.drain_timeout_s + 5
    assert cfg.device.state_dir == Path("/var/lib/") / svc["StateDirectory"]


def test_mosquitto_acl_binds_devices_to_their_own_prefix():
    acl = (DEPLOY / "mosquitto" / "acl").read_text().splitlines()
    rules = [line.split() for line in acl if line.strip() and not line.startswith("#")]
    device_writes = [r[2] for r in rules if r[:2] == ["pattern", "write"]]
    assert device_writes == ["peep/v1/+/%u/#"]
    conf = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text()
    for needle in ("allow_anonymous false", "password_file ", "acl_file ", "certfile ", "keyfile "):
        assert needle in conf
