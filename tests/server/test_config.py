"""server.toml -> ServerConfig: key paths in errors, secrets by reference, --validate-config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from peep.core.configfile import NOT_GIVEN
from peep.server.cli import main
from peep.server.config import ConfigError, load_config, parse_config, resolve_secrets, token_sha256

MINIMAL = """
[grpc]
listen = "127.0.0.1:0"
[bundle]
public_key = "keys/site.pub"
[auth]
allow_insecure = true
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "server.toml"
    p.write_text(text)
    return p


def test_minimal_config_resolves_relative_paths_against_the_file(tmp_path):
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.bundle.public_key == tmp_path / "keys" / "site.pub"
    assert cfg.storage.backend == "sqlite" and cfg.storage.path == tmp_path / "peep.db"
    assert cfg.training.preset == "default" and cfg.mqtt.share_group == "peep-server"


@pytest.mark.parametrize(
    ("patch", "key", "fragment"),
    [
        ({"grpc": {"listen": "nonsense"}}, "grpc.listen", "HOST:PORT"),
        ({"grpc": {"max_workers": 0}}, "grpc.max_workers", "greater than or equal to 1"),
        ({"grpc": {"unknown_key": 1}}, "grpc.unknown_key", "unknown key (check the spelling)"),
        ({"storage": {"backend": "mysql"}}, "storage.backend", "'sqlite' or 'postgres'"),
        ({"storage": {"dsn": "host=db password=hunter2"}}, "storage.dsn", "without a password"),
        ({"mqtt": {"share_group": "a/b"}}, "mqtt.share_group", "without '/'"),
        ({"auth": {"allow_insecure": True, "admin_token": "hunter2"}}, "auth.admin_token", "never the secret itself"),
        ({"auth": {"allow_insecure": True, "devices": [{"id": "bad/id"}]}}, "auth.devices[0].id", "A-Za-z0-9"),
        (
            {"auth": {"allow_insecure": True, "devices": [{"id": "c", "token_sha256": "xyz"}]}},
            "auth.devices[0].token_sha256",
            "64 hex",
        ),
        ({"training": {"mechanism_kind": "laplace"}}, "training.mechanism_kind", "expected one of"),
        ({"training": {"target_far": 0.9}}, "training.target_far", "less than 0.5"),
    ],
)
def test_errors_name_the_key_path_the_expectation_and_the_value(patch, key, fragment):
    data = {"grpc": {"listen": "127.0.0.1:0"}, "bundle": {"public_key": "/k.pub"}, "auth": {"allow_insecure": True}}
    for section, values in patch.items():
        data.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    paths = [p for p, _, _ in info.value.errors]
    assert key in paths, paths
    text = str(info.value)
    assert fragment in text
    assert f"{key}:" in text and "received" in text


def test_tls_is_required_unless_insecure_is_explicit():
    with pytest.raises(ConfigError, match="grpc.tls is missing"):
        parse_config({"bundle": {"public_key": "/k.pub"}})


def test_missing_section_is_named():
    with pytest.raises(ConfigError) as info:
        parse_config({"auth": {"allow_insecure": True}})
    assert ("bundle", "required setting is missing", NOT_GIVEN) in info.value.errors


def test_secrets_come_from_env_and_systemd_credentials(tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "admin-token").write_text("s3cret-admin\n")
    (creds / "cam-token").write_text("cam-secret")
    cfg = parse_config(
        {
            "bundle": {"public_key": "/k.pub"},
            "auth": {
                "allow_insecure": True,
                "admin_token": "credential:admin-token",
                "devices": [
                    {"id": "cam-1", "token": "credential:cam-token"},
                    {"id": "cam-2", "token": "env:CAM2_TOKEN"},
                ],
            },
            "mqtt": {"password": "env:PEEP_MQTT_PASSWORD"},
        }
    )
    env = {"CREDENTIALS_DIRECTORY": str(creds), "CAM2_TOKEN": "cam2", "PEEP_MQTT_PASSWORD": "mq-pw-491"}
    s = resolve_secrets(cfg, env)
    assert s.admin_token_sha256 == token_sha256("s3cret-admin")
    assert s.device_token_sha256 == {"cam-1": token_sha256("cam-secret"), "cam-2": token_sha256("cam2")}
    assert s.mqtt_password is not None and s.mqtt_password.get_secret_value() == "mq-pw-491"
    assert "mq-pw-491" not in repr(s)  # SecretStr never prints its value
    with pytest.raises(ConfigError) as info:
        resolve_secrets(cfg, {"CAM2_TOKEN": "x"})
    paths = [p for p, _, _ in info.value.errors]
    assert paths == ["auth.admin_token", "auth.devices[0].token", "mqtt.password"]
    assert "CREDENTIALS_DIRECTORY is not set" in str(info.value)


def test_validate_config_cli_prints_each_problem_and_exits_2(tmp_path, capsys):
    bad = write(tmp_path, MINIMAL.replace('listen = "127.0.0.1:0"', 'listen = "x"\nmax_workers = -1'))
    assert main(["serve", "--config", str(bad), "--validate-config"]) == 2
    err = capsys.readouterr().err
    assert "grpc.listen:" in err and "grpc.max_workers:" in err and "received" in err


def test_validate_config_cli_accepts_a_good_file(tmp_path, capsys, keypair):
    good = write(tmp_path, MINIMAL.replace("keys/site.pub", str(keypair[3])))
    assert main(["serve", "--config", str(good), "--validate-config"]) == 0
    assert "configuration OK" in capsys.readouterr().out


def test_validate_config_cli_checks_referenced_files(tmp_path, capsys):
    assert main(["serve", "--config", str(write(tmp_path, MINIMAL)), "--validate-config"]) == 2
    assert "bundle.public_key: expected a readable Ed25519 public key file" in capsys.readouterr().err


def test_example_config_in_deploy_is_valid():
    example = Path(__file__).resolve().parents[2] / "deploy" / "server" / "server.toml"
    cfg = load_config(example)
    assert cfg.grpc.tls is not None and cfg.grpc.grace_s < 30
    assert os.fspath(cfg.storage.path).startswith("/var/lib/peep")


def test_edge_and_server_default_to_the_same_topic_root_and_validate_it_alike():
    # Devices and servers must spell one root: both take it from peep.core.topics.
    from peep.core.topics import DEFAULT_ROOT
    from peep.edge.config import MqttConfig as EdgeMqtt
    from peep.server.config import MqttConfig as ServerMqtt
    from pydantic import ValidationError

    assert EdgeMqtt().topic_prefix == ServerMqtt().topic_prefix == DEFAULT_ROOT
    for bad in ("peep/v1/", "peep/+", "$SYS/x"):
        for model in (EdgeMqtt, ServerMqtt):
            with pytest.raises(ValidationError, match="expected topic levels such as 'peep/v1'"):
                model(topic_prefix=bad)


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:50051", "192.168.1.10:50051", "peep.example:50051"])
def test_insecure_grpc_is_refused_off_loopback_naming_both_keys(listen):
    data = {"grpc": {"listen": listen}, "bundle": {"public_key": "/k.pub"}, "auth": {"allow_insecure": True}}
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    (problem,) = info.value.errors
    assert problem.key == "grpc.listen/auth.allow_insecure"
    assert "loopback" in problem.message and listen in problem.message


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "127.1.2.3:50051", "[::1]:50051", "localhost:50051"])
def test_insecure_grpc_is_allowed_on_loopback(listen):
    data = {"grpc": {"listen": listen}, "bundle": {"public_key": "/k.pub"}, "auth": {"allow_insecure": True}}
    cfg = parse_config(data)
    assert cfg.grpc.tls is None


@pytest.mark.parametrize(("listen", "refused"), [("0.0.0.0:50051", True), ("127.0.0.1:50051", False)])
def test_open_reflection_is_for_loopback_only(listen, refused):
    data = {
        "grpc": {"listen": listen, "reflection": "open", "tls": {"cert": "/c.pem", "key": "/k.pem"}},
        "bundle": {"public_key": "/k.pub"},
    }
    if not refused:
        assert parse_config(data).grpc.reflection == "open"
        return
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    (problem,) = info.value.errors
    assert problem.key == "grpc.reflection/grpc.listen" and listen in problem.message
    data["grpc"]["reflection"] = "authenticated"
    assert parse_config(data).grpc.reflection == "authenticated"


def test_validate_config_refuses_insecure_grpc_on_every_interface(tmp_path, capsys, keypair):
    path = write(tmp_path, MINIMAL.replace("127.0.0.1:0", "0.0.0.0:50051").replace("keys/site.pub", str(keypair[3])))
    assert main(["serve", "--config", str(path), "--validate-config"]) == 2
    captured = capsys.readouterr()
    assert "TLS OFF" not in captured.out and "configuration OK" not in captured.out
    assert "grpc.listen/auth.allow_insecure: expected a loopback address" in captured.err


def _secrets_config() -> object:
    return parse_config(
        {
            "bundle": {"public_key": "/k.pub"},
            "auth": {
                "allow_insecure": True,
                "admin_token": "env:ADMIN",
                "devices": [{"id": "cam-1", "token": "credential:cam-token"}],
            },
            "mqtt": {"password": "env:MQTT_PW"},
        }
    )


def test_secrets_lose_one_trailing_newline(tmp_path):
    """A token that kept echo's newline would hash to something no client can send (the header cannot hold it)."""
    (tmp_path / "cam-token").write_text("cam-secret\r\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "ADMIN": "adm-secret\n", "MQTT_PW": "mot-de-passe-été\n"}
    s = resolve_secrets(_secrets_config(), env)
    assert s.admin_token_sha256 == token_sha256("adm-secret")
    assert s.device_token_sha256 == {"cam-1": token_sha256("cam-secret")}
    assert s.mqtt_password is not None and s.mqtt_password.get_secret_value() == "mot-de-passe-été"


@pytest.mark.parametrize(
    ("admin", "cam", "password", "problems"),
    [
        ("Zq7-adm\n\n", "ok", "ok", {"auth.admin_token": "found a line feed at position 8 of 8"}),
        ("Zq7-ädm", "ok", "ok", {"auth.admin_token": "expected a token of printable ASCII characters"}),
        ("ok", "Zq7\x1bcam", "ok", {"auth.devices[0].token": "found U+001B at position 4 of 7"}),
        ("ok", "ok", "Zq7\x00pw", {"mqtt.password": "found a NUL at position 4 of 6"}),
    ],
)
def test_a_secret_with_a_character_its_use_cannot_carry_is_refused_naming_the_key(
    tmp_path, admin, cam, password, problems
):
    (tmp_path / "cam-token").write_text(cam)
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path), "ADMIN": admin, "MQTT_PW": password}
    with pytest.raises(ConfigError) as info:
        resolve_secrets(_secrets_config(), env)
    got = {p.key: p.message for p in info.value.errors}
    assert set(got) == set(problems)
    for key, fragment in problems.items():
        assert fragment in got[key]
    assert "Zq7" not in str(info.value), "the secret itself is never printed"


def test_replica_id_names_the_mqtt_session_unless_client_id_is_set():
    base = {"grpc": {"listen": "127.0.0.1:0"}, "bundle": {"public_key": "/k.pub"}, "auth": {"allow_insecure": True}}
    cfg = parse_config({**base, "cluster": {"replica_id": "b"}})
    assert cfg.cluster.replica_id == "b" and cfg.mqtt.client_id == "peep-server-b"
    cfg = parse_config({**base, "cluster": {"replica_id": "b"}, "mqtt": {"client_id": "legacy-1"}})
    assert cfg.mqtt.client_id == "legacy-1"
    assert parse_config(base).mqtt.client_id is None  # the host name, as before
    with pytest.raises(ConfigError) as info:
        parse_config({**base, "cluster": {"replica_id": "a/b"}})
    assert "cluster.replica_id: expected a replica id" in str(info.value) and "received 'a/b'" in str(info.value)


def test_cluster_replica_configs_in_deploy_differ_only_by_the_replica_id():
    import difflib

    cluster = Path(__file__).resolve().parents[2] / "deploy" / "cluster"
    files = sorted(cluster.glob("replica-*.toml"))
    assert len(files) == 3
    texts = [f.read_text().splitlines() for f in files]
    for other in texts[1:]:
        changed = [ln for ln in difflib.unified_diff(texts[0], other, lineterm="", n=0) if ln[:1] in "+-"]
        changed = [ln for ln in changed if not ln.startswith(("+++", "---"))]
        assert len(changed) == 2 and all(ln[1:].startswith("replica_id = ") for ln in changed), changed
    cfgs = [load_config(f) for f in files]
    assert all(c.storage.backend == "postgres" and c.mqtt.enabled and c.grpc.tls is not None for c in cfgs)
    ids = [c.mqtt.client_id for c in cfgs]
    assert ids == ["peep-server-a", "peep-server-b", "peep-server-c"]
    assert len({c.mqtt.share_group for c in cfgs}) == 1
