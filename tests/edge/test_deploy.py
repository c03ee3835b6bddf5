"""deploy/ files for the edge: the systemd unit and the example config agree with the agent."""

from __future__ import annotations

import configparser
from pathlib import Path

from peep.edge.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def unit(name: str = "peep-edge.service") -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string((DEPLOY / "systemd" / name).read_text())
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
    """Devices write exactly their own templates and status, read their own events and the bundle, nothing else
    (no wildcard, no read of templates: they cannot take templates from the server's shared subscription);
    every other grant is the server's, under its own user."""
    acl = (DEPLOY / "mosquitto" / "acl").read_text().splitlines()
    rules = [line.split() for line in acl if line.strip() and not line.strip().startswith("#")]
    root = "devices/peep/v1"  # the devices' listener mounts their topics under devices/
    pattern = [r for r in rules if r[0] == "pattern"]
    assert sorted((r[1], r[2]) for r in pattern) == sorted(
        [
            ("write", f"{root}/+/%u/templates"),
            ("write", f"{root}/+/%u/status"),
            ("write", f"{root}/+/%u/report"),
            ("write", f"{root}/+/%u/claims"),  # a door's question before it releases anything
            ("write", f"{root}/+/%u/model_request"),  # a device deciding itself asks for its device model
            ("read", f"{root}/+/%u/events"),
            ("read", f"{root}/+/%u/model"),  # the answer, only its own
            ("read", f"{root}/bundle"),
            ("read", f"{root}/model"),  # every signed device model as it is issued (verified, kept only if its own)
            ("write", f"{root}/+/%u/lock"),  # a door states its lock, for Home Assistant's lock entity
            ("read", f"{root}/+/%u/lock_command"),  # and reads its commands (acted on only when it is told to)
        ]
    )
    assert all(len(r) == 3 for r in pattern), "a pattern rule has one access and one topic"
    # Nothing broader: the pattern rules apply to every client, so none may read templates or use '#'.
    assert not [r for r in pattern if "#" in r[2]]
    assert [r[1] for r in pattern if "templates" in r[2]] == ["write"]
    # `topic` rules belong to a user; before the first `user` line they would apply to clients without one.
    kinds = [r[0] for r in rules]
    assert set(kinds) <= {"pattern", "user", "topic"}
    first_user = kinds.index("user")
    assert "topic" not in kinds[:first_user]
    assert [r[1] for r in rules if r[0] == "user"] == ["peep-server", "home-assistant"]
    # Home Assistant reads; it writes only its own birth and will, never a device's topic or a door command.
    at = kinds.index("user", first_user + 1)
    ha = [tuple(r[1:]) for r in rules[at + 1 :]]
    assert [t for a, t in ha if "write" in a] == ["homeassistant/status"]
    assert all(t.startswith(("homeassistant/", f"{root}/+/+/")) or t == f"{root}/+/people/+/last_seen" for _, t in ha)
    # As shipped, nobody may write a door's lock command (the server neither): a deployer grants one account.
    assert not [r for r in rules if r[0] == "topic" and "write" in r[1] and r[2].endswith("lock_command")]
    conf = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text()
    for needle in ("allow_anonymous false", "password_file ", "acl_file ", "certfile ", "keyfile "):
        assert needle in conf
    lines = [line.strip() for line in conf.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    listeners = [i for i, line in enumerate(lines) if line.startswith("listener ")]
    assert len(listeners) == 2, "one listener for the devices, one for the server"
    dev = lines[listeners[0] : listeners[1]]
    srv = lines[listeners[1] :]
    assert "mount_point devices/" in dev and not any(line.startswith("mount_point") for line in srv)
    assert "per_listener_settings true" in lines
    for section in (dev, srv):
        assert "allow_anonymous false" in section and any(line.startswith("acl_file ") for line in section)
    assert next(line for line in dev if line.startswith("password_file ")) != next(
        line for line in srv if line.startswith("password_file ")
    ), "the server's listener has its own password file (no device can log in there)"
    assert "persistence true" in lines
    size = int(next(line.split()[1] for line in lines if line.startswith("max_packet_size ")))
    assert 0 < size <= 16 * 2**20


def test_the_example_door_configuration_is_a_keyed_fail_secure_door():
    cfg = load_config(DEPLOY / "edge" / "door.toml")
    assert cfg.door.enabled and cfg.door.lock == "gpio" and not cfg.door.gpio_active_high
    assert cfg.grpc.enabled and not cfg.mqtt.enabled and cfg.grpc.token_credential == "grpc-token"
    assert cfg.privacy.site_key is not None and cfg.privacy.mechanism == "privunit"
    assert 0 < cfg.door.open_s <= 5 and cfg.door.decision_timeout_s <= 10 and not cfg.bundle.accept_updates


def test_the_door_unit_stops_it_with_sigterm_before_systemd_would_kill_it():
    """SIGKILL skips releasing the lock: the door's unit gives it longer than its stop takes (the agent's 5 s
    drain and the lock released), and reads claims from a socket of its own runtime directory."""
    svc = unit("peep-edge-door.service")["Service"]
    assert svc["User"] == "peep-edge" and svc["KillSignal"] == "SIGTERM"
    assert int(svc["TimeoutStopSec"]) >= 15 and svc["RestartPreventExitStatus"] == "2"
    assert "peep-edge door --config /etc/peep-edge/door.toml" in svc["ExecStart"]
    runtime = svc["RuntimeDirectory"]
    assert f"--claims unix:/run/{runtime}/door.sock" in svc["ExecStart"]
    assert svc["NoNewPrivileges"] == "yes" and svc["CapabilityBoundingSet"] == ""
    cfg = load_config(DEPLOY / "edge" / "door.toml")
    assert cfg.device.state_dir == Path("/var/lib/") / svc["StateDirectory"]
    assert svc["LoadCredential"].startswith(f"{cfg.grpc.token_credential}:")
