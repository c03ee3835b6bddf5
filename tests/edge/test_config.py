"""The device config: typed, strict, errors naming the key; the device alone sets its noise."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from peep.edge.agent import Agent
from peep.edge.cli import main
from peep.edge.config import load_config, parse_config
from peep.edge.credentials import resolve_secret
from peep.edge.errors import ConfigError

BASE = {
    "device": {"id": "cam-1", "site": "lab", "state_dir": "state"},
    "bundle": {"path": "bundle", "public_key": "site.pub"},
    "privacy": {"epsilon": 4.0, "track_budget": 1000.0},
    "capture": {"source": 0},
}


def with_(section: str, **values):
    data = {k: dict(v) for k, v in BASE.items()}
    data.setdefault(section, {}).update(values)
    return data


def test_minimal_config_parses_with_documented_defaults(tmp_path):
    cfg = parse_config(BASE, base_dir=tmp_path)
    assert cfg.privacy.mechanism == "peep"
    assert (cfg.privacy.releases_per_window, cfg.privacy.window_seconds) == (1, 60.0)
    assert cfg.mqtt.tls is True and cfg.mqtt.port == 8883
    # Relative paths are resolved against the config file's directory.
    assert cfg.bundle.path == tmp_path / "bundle"
    assert cfg.spool_path == tmp_path / "state" / "spool.sqlite3"
    assert (cfg.spool.dead_letter_days, cfg.spool.dead_letter_max) == (7.0, 1000)
    assert cfg.mqtt_client_id == "peep-edge-lab-cam-1"


@pytest.mark.parametrize(
    ("section", "values", "path", "fragment"),
    [
        ("privacy", {"epsilon": 0}, "privacy.epsilon", "greater than or equal to 0.001"),
        # below the server's MIN_EPSILON every template would be refused at ingest
        ("privacy", {"epsilon": 1e-4}, "privacy.epsilon", "greater than or equal to 0.001"),
        ("soft", {"age_epsilon": 1e-5}, "soft.age_epsilon", "greater than or equal to 0.001"),
        ("privacy", {"epsilon": "high"}, "privacy.epsilon", "'high'"),
        ("privacy", {"mechanism": "gauss"}, "privacy.mechanism", "'laplace-l1'"),
        ("privacy", {"delta": 1e-5}, "privacy.delta", "expected 0 for the pure-ε mechanism 'peep'"),
        ("privacy", {"mechanism": "gaussian-l2"}, "privacy.delta", "expected 0 < delta < 1"),
        ("privacy", {"releases_per_window": 0}, "privacy.releases_per_window", "greater than or equal to 1"),
        ("privacy", {"track_budget": -1}, "privacy.track_budget", "greater than 0"),
        ("device", {"id": "cam/1"}, "device.id", "[A-Za-z0-9_.:@-]"),
        ("mqtt", {"port": 70000}, "mqtt.port", "less than or equal to 65535"),
        ("mqtt", {"password": "hunter2"}, "mqtt.password", "secrets are not accepted"),
        ("grpc", {"token": "abc"}, "grpc.token", "secrets are not accepted"),
        ("mqtt", {"cert_file": "c.pem"}, "mqtt.cert_file/mqtt.key_file", "both"),
        ("detector", {"kind": "yunet"}, "detector.model_path", "YuNet ONNX file"),
        ("mqtt", {"enabled": False}, "mqtt.enabled/grpc.enabled", "at least one transport"),
        ("capture", {"source": ""}, "capture.source", "empty string"),
        ("metrics", {"prot": 9108}, "metrics.prot", "unknown key"),
        ("spool", {"dead_letter_days": 0}, "spool.dead_letter_days", "greater than 0"),
        ("spool", {"dead_letter_days": 400}, "spool.dead_letter_days", "less than or equal to 365"),
        ("spool", {"dead_letter_max": 0}, "spool.dead_letter_max", "greater than or equal to 1"),
    ],
)
def test_bad_values_name_the_key_the_expectation_and_the_value(tmp_path, section, values, path, fragment):
    with pytest.raises(ConfigError) as info:
        parse_config(with_(section, **values), base_dir=tmp_path)
    problems = dict(info.value.problems)
    assert path in problems, info.value.problems
    assert fragment in problems[path]


@pytest.mark.parametrize("key", ["seed", "random_state", "sampler"])
def test_no_config_key_can_select_the_seeded_sampler(tmp_path, key):
    with pytest.raises(ConfigError) as info:
        parse_config(with_("privacy", **{key: 7}), base_dir=tmp_path)
    assert dict(info.value.problems)[f"privacy.{key}"].startswith("unknown key")


def test_missing_required_sections_are_listed(tmp_path):
    with pytest.raises(ConfigError) as info:
        parse_config({"device": {"id": "x", "site": "y"}}, base_dir=tmp_path)
    paths = {p for p, _ in info.value.problems}
    assert {"bundle", "privacy", "capture"} <= paths


def test_invalid_toml_is_a_config_error(tmp_path):
    p = tmp_path / "edge.toml"
    p.write_text("[device\nid = 1")
    with pytest.raises(ConfigError, match="--config: expected valid TOML"):
        load_config(p)


def test_secrets_come_from_credentials_directory_then_environment(tmp_path):
    (tmp_path / "mqtt-password").write_text("s3cret\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "PEEP_PW": "from-env"}
    assert resolve_secret(credential="mqtt-password", env="PEEP_PW", field="mqtt.password", environ=env) == "s3cret"
    assert resolve_secret(credential="absent", env="PEEP_PW", field="mqtt.password", environ=env) == "from-env"
    assert resolve_secret(credential=None, env=None, field="mqtt.password", environ=env) is None
    with pytest.raises(ConfigError, match="mqtt.password_credential: expected a systemd credential 'absent'"):
        resolve_secret(credential="absent", env=None, field="mqtt.password", environ=env)
    with pytest.raises(ConfigError, match=r"grpc.token_env: expected the environment variable NOPE"):
        resolve_secret(credential=None, env="NOPE", field="grpc.token", environ=env)


def test_the_device_config_alone_sets_the_noise(make_config, edge_bundle_dir, edge_keys, lfw_background, tmp_path, h):
    # A bundle whose advisory defaults ask for much weaker privacy changes nothing on the device.
    weak = h.build_edge_bundle(
        lfw_background,
        edge_keys["private"],
        tmp_path / "weak",
        n_faces=300,
        mechanism_defaults={"kind": "laplace-vector", "epsilon": 1e6, "delta": 0.0},
    )
    cfg = load_config(make_config(bundle={"path": str(weak)}, privacy={"mechanism": "peep", "epsilon": 2.0}))
    agent = Agent(cfg, environ={})
    agent.prepare()
    assert agent.releaser.kind == "peep"
    assert agent.releaser.mechanism.epsilon == 2.0
    assert agent.releaser.mechanism.is_secure
    g = agent.releaser.mechanism.guarantee
    assert g.epsilon_coordinate == pytest.approx(2.0) and g.epsilon_vector == pytest.approx(2.0 * 64)
    # Secure sampler: the same face released twice gets different noise.
    face = np.full((1, 62, 47), 0.5, dtype=np.float32)
    a, b = agent.releaser.release(face), agent.releaser.release(face)
    assert not np.array_equal(a, b)


def test_budget_must_allow_one_release(make_config):
    # peep, ε=4 per coordinate, nc=64: one release costs 256 per-vector ε.
    cfg = load_config(make_config(privacy={"epsilon": 4.0, "track_budget": 200.0}))
    with pytest.raises(ConfigError) as info:
        Agent(cfg, environ={}).prepare()
    msg = dict(info.value.problems)["privacy.track_budget"]
    assert "expected at least 256 per-vector ε" in msg and "per-coordinate ε=4" in msg and "received 200" in msg


def test_validate_config_prints_both_epsilons_and_exits_0(make_config, capsys):
    path = make_config(privacy={"epsilon": 4.0, "track_budget": 1024.0})
    assert main(["run", "--config", str(path), "--validate-config"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] and out["secure_sampler"] is True
    assert out["epsilon_coordinate"] == 4.0 and out["epsilon_vector"] == 256.0
    assert out["releases_per_track_max"] == 4


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"privacy": {"epsilon": -1.0}}, "privacy.epsilon"),
        ({"privacy": {"seed": 42}}, "privacy.seed: unknown key"),
        ({"mqtt": {"password_credential": "mqtt-password"}}, "mqtt.password_credential"),
        ({"bundle": {"path": "/nonexistent/bundle"}}, "bundle.path: expected a bundle directory"),
        ({"bundle": {"public_key": "/nonexistent.pub"}}, "bundle.public_key"),
        ({"soft": {"enabled": True, "age_epsilon": 0}}, "soft.age_epsilon"),
    ],
)
def test_validate_config_errors_exit_2_naming_the_field(make_config, capsys, monkeypatch, override, needle):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    path = make_config(**override)
    assert main(["run", "--config", str(path), "--validate-config"]) == 2
    err = capsys.readouterr().err
    assert "invalid configuration" in err and needle in err


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "--config: expected a readable TOML file" in capsys.readouterr().err


def test_example_config_in_deploy_is_valid_apart_from_site_paths(tmp_path):
    example = Path(__file__).resolve().parents[2] / "deploy" / "edge" / "edge.toml"
    cfg = load_config(example)
    assert cfg.mqtt.tls and cfg.mqtt.password_credential
    assert cfg.privacy.track_budget >= cfg.privacy.epsilon
    assert os.fspath(cfg.device.state_dir) == "/var/lib/peep-edge"


def test_yunet_without_its_model_file_is_a_config_error(make_config, tmp_path):
    cfg = load_config(make_config(detector={"kind": "yunet", "model_path": str(tmp_path / "yunet.onnx")}))
    with pytest.raises(ConfigError) as info:
        Agent(cfg, environ={}).prepare()
    assert "expected a YuNet ONNX file" in dict(info.value.problems)["detector.model_path"]


def test_a_mechanism_the_bundle_has_no_output_for_is_refused_at_start(
    make_config, tmp_path, lfw_background, edge_keys, capsys, h
):
    """A privunit device with a bundle whose projector lacks the 'unit' output refuses to start,
    naming the mechanism, the missing output and the bundle (exit 2, bundle.path), instead of releasing anything."""
    from peep.core import domains
    from peep.core.projections import base as projection_base

    mp = pytest.MonkeyPatch()
    mp.setattr(projection_base, "DOMAINS", {k: v for k, v in domains.DOMAINS.items() if k != "unit"})
    old = h.build_edge_bundle(lfw_background, edge_keys["private"], tmp_path / "old-bundle", n_components=16)
    mp.undo()
    path = make_config(
        bundle={"path": str(old)}, privacy={"mechanism": "privunit", "epsilon": 16.0, "track_budget": 64.0}
    )
    assert main(["run", "--config", str(path), "--validate-config"]) == 2
    err = capsys.readouterr().err
    assert "bundle.path: refusing to start" in err and "privunit" in err and "'unit'" in err


def test_a_secret_loses_one_trailing_newline_and_nothing_else(tmp_path):
    # `echo token > file` and `export TOKEN=$(cat file)`-style stores leave a newline; gRPC would refuse
    # "Bearer token\n" on every send with INTERNAL "Invalid metadata".
    (tmp_path / "grpc-token").write_text("tok-123\r\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "TOK": "tok-123\n", "PW": "mot-de-passe-été\n"}
    assert resolve_secret(credential=None, env="TOK", field="grpc.token", environ=env) == "tok-123"
    assert resolve_secret(credential="grpc-token", env=None, field="grpc.token", environ=env) == "tok-123"
    assert resolve_secret(credential=None, env="PW", field="mqtt.password", environ=env) == "mot-de-passe-été"


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("grpc.token", "Zq7-tok\n\n", "found a line feed at position 8 of 8"),
        ("grpc.token", "Zq7\x00tok", "found a NUL at position 4 of 7"),
        ("grpc.token", "Zq7-tök", "found U+00F6 at position 6 of 7"),
        ("grpc.token", " Zq7-tok", "without leading or trailing spaces"),
        ("grpc.token", "\n", "expected a non-empty secret"),
        ("mqtt.password", "Zq7\tpass", "found a tab at position 4 of 8"),
    ],
)
def test_a_secret_an_http2_header_or_the_broker_cannot_take_is_refused_naming_the_key(tmp_path, field, value, fragment):
    with pytest.raises(ConfigError) as info:
        resolve_secret(credential=None, env="SECRET", field=field, environ={"SECRET": value})
    message = dict(info.value.problems)[f"{field}_env"]
    assert fragment in message and "$SECRET" in message
    assert "Zq7" not in str(info.value), "the secret itself is never printed"
    (tmp_path / "secret").write_text(value)
    with pytest.raises(ConfigError) as info:
        resolve_secret(credential="secret", env=None, field=field, environ={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    message = dict(info.value.problems)[f"{field}_credential"]
    assert fragment in message and str(tmp_path / "secret") in message and "Zq7" not in message


def test_validate_config_refuses_a_token_with_a_control_character_naming_the_key(make_config, capsys, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("PEEP_TEST_GRPC_TOKEN", "tok\n\n")
    path = make_config(grpc={"enabled": True, "token_env": "PEEP_TEST_GRPC_TOKEN"})
    assert main(["run", "--config", str(path), "--validate-config"]) == 2
    assert "grpc.token_env: expected a secret without control characters" in capsys.readouterr().err
    monkeypatch.setenv("PEEP_TEST_GRPC_TOKEN", "tok\n")
    agent = Agent(load_config(path))
    agent.prepare()
    assert agent.grpc_token == "tok"
