"""`peep serve --validate-config` runs the checks start-up runs: what one refuses, the other refuses too,
with exit code 2 and the key named."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from peep.core.bundle import write_keypair
from peep.lab.processes.pki import LocalCA
from peep.server.cli import main
from peep_testing.server import base_config, tls_section, to_toml


def flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def bundle_copy(bundle_dir, tmp_path) -> Path:
    d = tmp_path / "bundle-copy"
    shutil.copytree(bundle_dir, d)
    return d


@pytest.fixture
def not_started(monkeypatch):
    """If the checks pass, `peep serve` reaches ServerApp.run: record it instead of serving forever."""
    from peep.server.app import ServerApp

    started: list[bool] = []

    def run(self: Any) -> int:
        started.append(True)
        self.services.close()
        return 99

    monkeypatch.setattr(ServerApp, "run", run)
    return started


def write_config(tmp_path: Path, cfg: dict[str, Any]) -> str:
    cfg["auth"]["devices"] = []  # the device registry plays no part here
    p = tmp_path / "server.toml"
    p.write_text(to_toml(cfg))
    return str(p)


def validate_and_start(path: str, capsys) -> tuple[int, str, int, str]:
    rc_validate = main(["serve", "--config", path, "--validate-config", "--no-mqtt"])
    err_validate = capsys.readouterr().err
    rc_start = main(["serve", "--config", path, "--no-mqtt"])
    err_start = capsys.readouterr().err
    return rc_validate, err_validate, rc_start, err_start


def test_a_good_configuration_validates_and_starts(tmp_path, keypair, bundle_dir, pki, capsys, not_started):
    path = write_config(tmp_path, base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)}))
    assert main(["serve", "--config", path, "--validate-config", "--no-mqtt"]) == 0
    assert "configuration OK" in capsys.readouterr().out
    assert main(["serve", "--config", path, "--no-mqtt"]) == 99 and not_started == [True]


def _tampered(tmp_path, keypair, bundle_copy, pki):
    flip_byte(bundle_copy / "projector.onnx")
    return keypair[3], bundle_copy, "bundle.dir", "projector.onnx: SHA-256 does not match the signed manifest"


def _foreign(tmp_path, keypair, bundle_copy, pki):
    _, other_pub = write_keypair(tmp_path / "other")
    return other_pub, bundle_copy, "bundle.dir", "signature.sig: Ed25519 signature does not verify with the pinned key"


def _certificate_as_key(tmp_path, keypair, bundle_copy, pki):
    return pki.server_cert, bundle_copy, "bundle.public_key", "received an X.509 certificate"


def _missing_dir(tmp_path, keypair, bundle_copy, pki):
    return keypair[3], tmp_path / "no-such-bundle", "bundle.dir", "expected a signed bundle directory"


@pytest.mark.parametrize("case", [_tampered, _foreign, _certificate_as_key, _missing_dir])
def test_a_bundle_start_up_refuses_is_refused_by_validation_too(
    tmp_path, keypair, bundle_copy, pki, capsys, not_started, case
):
    pub, bundle, key, fragment = case(tmp_path, keypair, bundle_copy, pki)
    path = write_config(tmp_path, base_config(tmp_path, pub, bundle, grpc={"tls": tls_section(pki)}))
    rc_validate, err_validate, rc_start, err_start = validate_and_start(path, capsys)
    assert not not_started, "start-up must refuse before serving"
    for rc, err in ((rc_validate, err_validate), (rc_start, err_start)):
        assert rc == 2, err
        line = next(x for x in err.splitlines() if x.strip().startswith(f"{key}:"))
        assert fragment in line, err
        assert "PosixPath" not in err


@pytest.fixture(scope="module")
def other_tls(tmp_path_factory):
    d = tmp_path_factory.mktemp("other-tls")
    ca = LocalCA("other", days=2)
    cert, key = ca.issue_server(("localhost",)).write(d / "other.pem", d / "other.key")
    return {"cert": cert, "key": key}


@pytest.mark.parametrize(
    ("tls", "key", "fragment"),
    [
        (lambda pki, o: {"key": str(o["key"])}, "grpc.tls.key", "expected the private key of the certificate"),
        (lambda pki, o: {"cert": str(pki.server_key)}, "grpc.tls.cert", "no certificate in it"),
        (lambda pki, o: {"key": str(pki.server_cert)}, "grpc.tls.key", "expected an unencrypted PEM private key"),
        (lambda pki, o: {"client_ca": "/nonexistent/ca.pem"}, "grpc.tls.client_ca", "expected a readable PEM file"),
        (lambda pki, o: {"client_ca": str(pki.server_key)}, "grpc.tls.client_ca", "expected PEM CA certificate(s)"),
    ],
)
def test_grpc_tls_files_are_checked_as_the_listener_uses_them(
    tmp_path, keypair, bundle_dir, pki, other_tls, capsys, not_started, tls, key, fragment
):
    section = {**tls_section(pki), **tls(pki, other_tls)}
    path = write_config(tmp_path, base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": section}))
    rc_validate, err_validate, rc_start, err_start = validate_and_start(path, capsys)
    assert not not_started
    for rc, err in ((rc_validate, err_validate), (rc_start, err_start)):
        assert rc == 2, err
        assert any(x.strip().startswith(f"{key}: expected") and fragment in x for x in err.splitlines()), err


def test_mqtt_tls_files_are_checked_when_mqtt_is_on(tmp_path, keypair, bundle_dir, pki, capsys):
    cfg = base_config(
        tmp_path,
        keypair[3],
        bundle_dir,
        grpc={"tls": tls_section(pki)},
        mqtt={"enabled": True, "tls": {"ca": str(tmp_path / "missing-ca.pem")}},
    )
    path = write_config(tmp_path, cfg)
    assert main(["serve", "--config", path, "--validate-config"]) == 2
    assert "mqtt.tls.ca: expected a readable PEM file" in capsys.readouterr().err
    # --no-mqtt: the broker (and its TLS files) are not used, so not checked.
    assert main(["serve", "--config", path, "--validate-config", "--no-mqtt"]) == 0
