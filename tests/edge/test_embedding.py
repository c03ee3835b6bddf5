"""dlib's ResNet descriptor on the device: real models, real LFW faces, real videos, signed bundles.

The models come from the installed ``face_recognition_models`` (extra
``peep-edge[dlib]``, installed by scripts/bootstrap.sh); nothing is downloaded.
Each descriptor costs ~0.1-0.3 s here, so the tests use a few dozen faces.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from peep.core.bundle import ProjectionBundle, build_bundle_files, write_bundle_files
from peep.core.exceptions import BundleError
from peep.core.imaging import HaarFaceDetector, primary_face
from peep.core.projections import DlibResNetProjection
from peep.core.projections.descriptor import DLIB_RESNET_MODEL_SHA256
from peep.core.wire import decode_template
from peep.edge.agent import Agent
from peep.edge.bundles import BundleRefused
from peep.edge.capture import VideoSource
from peep.edge.cli import main
from peep.edge.config import load_config
from peep.edge.embedding import DlibResNetEncoder, encoder_for_bundle, model_files
from peep.edge.errors import MissingExtraError
from peep.edge.tracking import YOUNG

K = 8


@pytest.fixture(scope="module")
def encoder() -> DlibResNetEncoder:
    return DlibResNetEncoder()


def _describe(encoder: DlibResNetEncoder, paths: list[Path]) -> np.ndarray:
    det = HaarFaceDetector()
    out = []
    for p in paths:
        color = cv2.imread(str(p), cv2.IMREAD_COLOR)
        box = primary_face(det.detect(cv2.cvtColor(color, cv2.COLOR_BGR2GRAY)), color.shape)
        assert box is not None, p
        out.append(encoder.encode(color, box))
    return np.stack(out)


@pytest.fixture(scope="module")
def background_descriptors(encoder, data_home) -> np.ndarray:
    """Descriptors of 36 faces of LFW people with 5-9 images (public; disjoint from the videos' people)."""
    from peep.edge.testing import lfw_people

    few = [files for files in lfw_people(data_home, min_images=5).values() if len(files) <= 9]
    return _describe(encoder, [f for files in few[:12] for f in files[:3]])


def _descriptor_bundle(descriptors, network: dict[str, Any], key, out: Path, *, created_at: float | None = None):
    from peep.core.imaging import DEFAULT_GEOMETRY

    files = build_bundle_files(
        projection=DlibResNetProjection(n_components=K, network=network).fit(descriptors.astype(np.float64)),
        geometry=DEFAULT_GEOMETRY,
        signing_key=key,
        normalisation={"detector": "haar"},
        mechanism_defaults={"kind": "privunit", "epsilon": 8.0},
        created_at=created_at,
    )
    return write_bundle_files(files, out)


@pytest.fixture(scope="module")
def dlib_bundle_dir(background_descriptors, encoder, edge_keys, tmp_path_factory) -> Path:
    return _descriptor_bundle(
        background_descriptors, encoder.identity, edge_keys["private"], tmp_path_factory.mktemp("dlib-bundle")
    )


def test_the_installed_network_is_the_one_the_product_trusts(encoder):
    ident = encoder.identity
    assert ident["kind"] == "dlib-resnet" and ident["package"].startswith("face_recognition_models")
    assert {k: ident[k] for k in DLIB_RESNET_MODEL_SHA256} == DLIB_RESNET_MODEL_SHA256
    # Only the 5-point model and the ResNet are used (the 68-point model's training data is non-commercial).
    assert set(model_files()) == {"landmarks", "network"}
    assert "68" not in model_files()["landmarks"].name


def test_descriptors_of_real_faces_separate_people(encoder, people):
    names = sorted(people)[:3]
    D = {n: _describe(encoder, people[n][:3]) for n in names}
    assert all(d.shape == (3, 128) and d.dtype == np.float32 for d in D.values())
    same = [np.linalg.norm(d[i] - d[j]) for d in D.values() for i in range(3) for j in range(i + 1, 3)]
    diff = [np.linalg.norm(D[a][0] - D[b][0]) for a in names for b in names if a < b]
    # dlib's own threshold is 0.6; same-person pairs must sit clearly below the different-person ones.
    assert np.mean(same) < 0.6 < np.mean(diff), (same, diff)
    # Gray frames (an IR camera) work too.
    gray = cv2.imread(str(people[names[0]][0]), cv2.IMREAD_GRAYSCALE)
    box = primary_face(HaarFaceDetector().detect(gray), gray.shape)
    assert box is not None and encoder.encode(gray, box).shape == (128,)


@pytest.mark.slow
def test_a_bundle_built_for_this_network_gets_its_encoder_and_another_is_refused(encoder, dlib_bundle_dir, edge_keys):
    bundle = ProjectionBundle.load(dlib_bundle_dir, edge_keys["public"])
    assert bundle.input_kind == "dlib-resnet"
    assert isinstance(encoder_for_bundle(bundle.input, bundle_id=bundle.bundle_id), DlibResNetEncoder)
    assert encoder_for_bundle({"kind": "pixels"}) is None
    other = {**bundle.input, "network": {**bundle.input["network"], "network_sha256": "ab" * 32}}
    with pytest.raises(BundleError, match=r"network_sha256 abababababababab…, this device has 55533b28a95800a5…"):
        encoder_for_bundle(other, bundle_id=bundle.bundle_id)
    with pytest.raises(BundleError, match="input kind 'arcface' is not a descriptor this device can compute"):
        encoder_for_bundle({"kind": "arcface"})


def test_without_the_extra_the_error_names_it(monkeypatch, make_config, dlib_bundle_dir, capsys):
    real = importlib.util.find_spec

    def no_models(name: str, *args: Any):
        return None if name == "face_recognition_models" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_models)
    with pytest.raises(MissingExtraError, match=r"peep-edge\[dlib\].*'face_recognition_models' is not installed"):
        DlibResNetEncoder()
    path = make_config(bundle={"path": str(dlib_bundle_dir)}, privacy={"mechanism": "privunit", "epsilon": 8.0})
    assert main(["run", "--config", str(path), "--validate-config"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'peep-edge[dlib]'" in err, err


def test_the_agent_refuses_a_bundle_for_another_network(
    make_config, background_descriptors, encoder, edge_keys, tmp_path
):
    network = {**encoder.identity, "landmarks_sha256": "cd" * 32}
    other = _descriptor_bundle(background_descriptors, network, edge_keys["private"], tmp_path / "other-net")
    cfg = load_config(make_config(bundle={"path": str(other)}, privacy={"mechanism": "privunit", "epsilon": 8.0}))
    with pytest.raises(BundleRefused, match="landmarks_sha256 cdcdcdcdcdcdcdcd…"):
        Agent(cfg, environ={}).prepare()


class CountingEncoder:
    """The real encoder, counting its calls (the descriptor must run per release, not per frame)."""

    def __init__(self, inner: DlibResNetEncoder) -> None:
        self.inner, self.calls = inner, 0
        self.kind, self.dimension = inner.kind, inner.dimension

    @property
    def identity(self) -> dict[str, Any]:
        return self.inner.identity

    def encode(self, image, box):
        self.calls += 1
        return self.inner.encode(image, box)


@pytest.mark.slow
def test_a_video_releases_descriptor_templates_and_runs_the_network_per_release_and_as_the_tracker_asks(
    make_config, dlib_bundle_dir, edge_keys, one_person_video, encoder
):
    cfg = load_config(
        make_config(
            bundle={"path": str(dlib_bundle_dir)},
            privacy={
                "mechanism": "privunit",
                "epsilon": 8.0,
                "track_budget": 1e6,
                "releases_per_window": 1,
                "window_seconds": 10.0,
                "min_track_frames": 3,
            },
        )
    )
    agent = Agent(cfg, environ={})
    try:
        pipeline = agent.open()
        counting = CountingEncoder(encoder)
        pipeline.set_releaser(pipeline.releaser, counting)  # type: ignore[arg-type]
        src = VideoSource(one_person_video["path"], kind="file")
        n = 0
        while (frame := src.read()) is not None and n < 150:  # 30 s: releases at 0.4, 10.4, 20.4 s
            pipeline.process(frame)
            n += 1
        src.close()
        assert agent.spool is not None
        msgs = [decode_template(it.payload) for it in agent.spool.peek("mqtt", 100)]
    finally:
        agent.shutdown(drain_timeout=0)
    # the releases, and the tracker's views of the face: a young track's first few, then one every refresh_s
    described = pipeline.tracker.described
    assert len(msgs) == 3 and counting.calls == 3 + described
    assert YOUNG <= described <= YOUNG + 30.0 / cfg.tracker.refresh_s + 1, described
    bundle = ProjectionBundle.load(dlib_bundle_dir, edge_keys["public"])
    for m in msgs:
        assert m.bundle_id == bundle.bundle_id and len(m.values) == K
        assert m.mechanism.epsilon_vector == pytest.approx(8.0, rel=1e-3)
    assert agent.metrics.value("peep_edge_frames_total") == 150


def test_a_bundle_update_switches_between_pixel_and_descriptor_input(
    make_config, background_descriptors, encoder, edge_keys, tmp_path
):
    from peep.v1 import recognition_pb2

    cfg = load_config(make_config(privacy={"mechanism": "privunit", "epsilon": 8.0, "track_budget": 1e6}))
    agent = Agent(cfg, environ={})
    try:
        pipeline = agent.open()
        assert pipeline.encoder is None
        newer = _descriptor_bundle(
            background_descriptors,
            encoder.identity,
            edge_keys["private"],
            tmp_path / "newer",
            created_at=time.time() + 60,
        )
        candidate = ProjectionBundle.load(newer, edge_keys["public"])
        msg = recognition_pb2.BundleFiles(bundle_id=candidate.bundle_id)
        for name in sorted(candidate.files):
            msg.files.add(name=name, content=candidate.files[name])
        agent._bundle_updates.put(msg.SerializeToString())
        agent._apply_bundle_updates()
        assert pipeline.releaser.bundle_id == candidate.bundle_id
        assert isinstance(pipeline.encoder, DlibResNetEncoder)
        meta = json.loads(candidate.files["metadata.json"])
        assert meta["input"]["kind"] == "dlib-resnet"
    finally:
        agent.shutdown(drain_timeout=0)
