"""What the device-model tests share: a signing key, a calibration set of strangers' clean projections, and a
server that issues device models (TLS, SQLite or PostgreSQL, lfw100 enrolled with a public background, trained
by the Train call).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from peep.core.devicemodel import DeviceModel, verify_device_model_files
from peep.core.wire import decode_device_model

from peep_testing.server import ADMIN, Pki, RunningServer, Templates, base_config, start_server, tls_section

#: What a device model of the tests may weigh (all files).
MAX_BYTES = 64 * 1024 * 1024


@pytest.fixture(scope="session")
def model_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path, Path]:
    """The deployer's device-model signing key: (private, public, key path, pub path)."""
    from peep.core.bundle import load_private_key, load_public_key, write_keypair

    key_path, pub_path = write_keypair(tmp_path_factory.mktemp("keys") / "models")
    return load_private_key(key_path), load_public_key(pub_path), key_path, pub_path


def stranger_people(templates: Templates, lfw_background: Any) -> np.ndarray:
    """Mask of lfw_background's faces of people who are not in the server's background class (the strangers)."""
    bg = np.unique(np.asarray(templates.background_people))
    return ~np.isin(lfw_background.labels, bg)


@pytest.fixture(scope="session")
def calibration_path(tmp_path_factory: pytest.TempPathFactory, bundle: Any, lfw_background: Any, templates: Templates
                     ) -> Path:  # fmt: skip
    """Clean, unkeyed projections (the templates' box_clipped domain) of the people never trained on."""
    from peep.server.bundles.calibrate import write_calibration

    mask = stranger_people(templates, lfw_background)
    proj = bundle.project(lfw_background.images[mask], "box_clipped")
    tags = [lfw_background.target_names[int(k)].replace(" ", "_") for k in lfw_background.labels[mask]]
    path = tmp_path_factory.mktemp("calibration") / "calibration.npz"
    write_calibration(path, projections=proj, people=tags, bundle_id=bundle.bundle_id, domain="box_clipped",
                      mechanism="peep-raw")  # fmt: skip
    return path


def device_model_section(model_keys: Any, calibration_path: Path, **more: Any) -> dict[str, Any]:
    return {"signing_key": str(model_keys[2]), "calibration": str(calibration_path), **more}


def start_trained(
    tmp: Path, pki: Pki, keypair: Any, bundle_dir: Path, templates: Templates, model_keys: Any,
    calibration_path: Path, *, storage: dict[str, Any] | None = None, **sections: dict[str, Any],
) -> RunningServer:  # fmt: skip
    """A TLS server issuing device models, lfw100's 70 % and the background enrolled, v000001 trained by Train."""
    from peep.v1 import recognition_pb2

    training = {"model_dir": str(tmp / "models"), "device_models": device_model_section(model_keys, calibration_path)}
    training.update(sections.pop("training", {}))
    cfg = base_config(tmp, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)}, training=training, **sections)
    if storage is not None:
        cfg["storage"] = storage
    srv = start_server(cfg, pki, tmp)
    stub = srv.stub()
    summary = stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60)
    assert summary.rejected == 0, summary.acks[0].reason if summary.acks else ""
    resp = stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
    assert resp.model_version == "v000001"
    return srv


def verified(payload: bytes, public_key: Any, **kw: Any) -> DeviceModel:
    """The device model an encoded DeviceModelFiles carries, verified as a device verifies it."""
    serial, files = decode_device_model(payload, max_bytes=MAX_BYTES)
    model = verify_device_model_files(files, public_key, **kw)
    assert model.serial == serial
    return model


def random_device_model(bundle: Any, key: Any, *, serial: int, k_subjects: int = 4, key_id: str = "") -> Any:
    """A signed linear device model over random class directions (what a camera decides with), for ``bundle``."""
    import time

    from peep.core.devicemodel import build_device_model_files
    from peep.server.recognition.export import _linear_onnx

    rng = np.random.default_rng(serial)
    n = bundle.n_components
    means = rng.standard_normal((k_subjects + 1, n))
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    public = rng.standard_normal((300, n))
    public /= np.linalg.norm(public, axis=1, keepdims=True)
    return build_device_model_files(
        onnx=_linear_onnx(20.0 * means.T, np.zeros(k_subjects + 1)), calibration=public.astype(np.float32),
        subjects=[f"s{i}" for i in range(k_subjects)] + [""], background_index=k_subjects, serial=serial,
        model_version="v0001", bundle_id=bundle.bundle_id, key_id=key_id, n_components=n, trained_at=time.time(),
        signing_key=key, fpir=0.2, extra={"domain": "unit"},
    )  # fmt: skip
