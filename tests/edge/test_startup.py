"""`peep-edge run --validate-config` runs the checks start-up runs (Agent.prepare): a bundle, key, TLS file
or state directory start-up would refuse is refused by validation too, exit 2 naming the key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from peep.edge.agent import Agent
from peep.edge.cli import main
from peep.edge.config import load_config
from peep.edge.errors import ConfigError


def flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def bundle_copy(edge_bundle_dir, tmp_path) -> Path:
    d = tmp_path / "bundle-copy"
    shutil.copytree(edge_bundle_dir, d)
    return d


def problems_of(path: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        Agent(load_config(path), environ={}).prepare()
    return dict(info.value.problems)


def validate(path: Path, capsys) -> tuple[int, str]:
    rc = main(["run", "--config", str(path), "--validate-config"])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    ("sections", "key", "fragment"),
    [
        ({"mqtt": {"tls": True, "ca_file": "missing-ca.pem"}}, "mqtt.ca_file", "expected a readable PEM file"),
        ({"mqtt": {"tls": True, "ca_file": "{server_key}"}}, "mqtt.ca_file", "expected PEM CA certificate(s)"),
        (
            {"mqtt": {"tls": True, "ca_file": "{ca}", "cert_file": "{client}", "key_file": "{server_key}"}},
            "mqtt.key_file",
            "expected the private key of the certificate",
        ),
        (
            {"mqtt": {"tls": True, "ca_file": "{ca}", "cert_file": "{client_key}", "key_file": "{client_key}"}},
            "mqtt.cert_file",
            "no certificate in it",
        ),
        (
            {"mqtt": {"enabled": False}, "grpc": {"enabled": True, "ca_file": "missing-ca.pem"}},
            "grpc.ca_file",
            "expected a readable PEM file",
        ),
        (
            {"mqtt": {"enabled": False}, "grpc": {"enabled": True, "cert_file": "{client}", "key_file": "{ca}"}},
            "grpc.key_file",
            "expected an unencrypted PEM private key",
        ),
        ({"device": {"state_dir": "{ca}/state"}}, "device.state_dir", "is not a directory"),
    ],
)
def test_files_start_up_would_refuse_are_refused_by_validation(make_config, pki, capsys, sections, key, fragment):
    for values in sections.values():
        for k, v in values.items():
            if isinstance(v, str) and "{" in v:
                values[k] = v.format(**{name: str(p) for name, p in pki.items()})
    path = make_config(**sections)
    rc, err = validate(path, capsys)
    assert rc == 2, err
    assert any(x.strip().startswith(f"{key}: expected") and fragment in x for x in err.splitlines()), err
    assert fragment in problems_of(path)[key]  # Agent.prepare is what validation runs, and what start-up runs


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda d, keys: flip_byte(d / "projector.onnx"), "projector.onnx: SHA-256 does not match"),
        (lambda d, keys: None, "signature.sig: Ed25519 signature does not verify with the pinned key"),
    ],
    ids=["tampered", "foreign-signed"],
)
def test_a_tampered_or_foreign_bundle_fails_validation_with_exit_2(
    bundle_copy, make_config, edge_keys, capsys, damage, fragment
):
    damage(bundle_copy, edge_keys)
    pub = edge_keys["pub_path"] if "SHA-256" in fragment else edge_keys["other_pub_path"]
    path = make_config(bundle={"path": str(bundle_copy), "public_key": str(pub)})
    rc, err = validate(path, capsys)
    assert rc == 2 and "bundle.path: refusing to start" in err and fragment in err, err


def test_a_certificate_given_as_the_pinned_key_is_named_without_a_python_repr(make_config, pki, capsys):
    path = make_config(bundle={"public_key": str(pki["ca"])})
    rc, err = validate(path, capsys)
    assert rc == 2 and "bundle.public_key: expected the deployer's Ed25519 public key" in err, err
    assert "received an X.509 certificate" in err and "PosixPath" not in err


def test_a_configuration_that_validates_passes_the_tls_checks(make_config, pki, capsys):
    path = make_config(mqtt={"tls": True, "ca_file": str(pki["ca"]), "cert_file": str(pki["client"]),
                             "key_file": str(pki["client_key"])})  # fmt: skip
    rc = main(["run", "--config", str(path), "--validate-config"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)["valid"] is True
