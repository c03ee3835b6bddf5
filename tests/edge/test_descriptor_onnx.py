"""The descriptor on onnxruntime as a device runs it: dlib's alignment, the graph from the cache, the check.

Real models (the installed ``face_recognition_models``), real LFW faces found by
the Haar detector; graphs built into ``tmp_path`` or the session's cache folder.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from peep.core.imaging import HaarFaceDetector, primary_face

pytest.importorskip("dlib", reason="dlib (extra peep-edge[dlib]) is not installed")
pytest.importorskip("onnx", reason="onnx (extra peep-edge[dlib]) is not installed")

from peep.edge.descriptor_onnx import TOLERANCE, DescriptorGraphError, graph_path
from peep.edge.embedding import (
    DlibResNetEncoder,
    OnnxResNetEncoder,
    encoder_for_bundle,
    make_encoder,
    model_files,
)


@pytest.fixture(scope="module")
def graph_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("descriptor-graphs")


@pytest.fixture(scope="module")
def onnx_encoder(graph_cache) -> OnnxResNetEncoder:
    return OnnxResNetEncoder(cache_dir=graph_cache)


@pytest.fixture(scope="module")
def faces(data_home) -> list[tuple[np.ndarray, object]]:
    """Eight LFW photos of four people with 5-9 images, each with its Haar face box."""
    from peep.edge.testing import lfw_people

    few = [files for files in lfw_people(data_home, min_images=5).values() if len(files) <= 9][:4]
    det, out = HaarFaceDetector(), []
    for path in [f for files in few for f in files[:2]]:
        color = cv2.imread(str(path), cv2.IMREAD_COLOR)
        box = primary_face(det.detect(cv2.cvtColor(color, cv2.COLOR_BGR2GRAY)), color.shape)
        assert box is not None, path
        out.append((color, box))
    return out


def test_the_onnx_descriptor_of_a_real_face_is_dlibs_within_the_tolerance(onnx_encoder, faces):
    reference = DlibResNetEncoder()
    ours = np.stack([onnx_encoder.encode(image, box) for image, box in faces])
    theirs = np.stack([reference.encode(image, box) for image, box in faces])
    assert ours.shape == theirs.shape == (len(faces), 128)
    assert float(np.max(np.abs(ours - theirs))) <= TOLERANCE
    # A batch gives what one face at a time gives.
    assert np.allclose(onnx_encoder.encode_many(faces), ours, atol=1e-6, rtol=0)
    assert onnx_encoder.encode_many([]).shape == (0, 128)


def test_the_same_network_identity_so_bundles_serve_both_back_ends(onnx_encoder):
    dlib_identity = DlibResNetEncoder().identity
    ours = onnx_encoder.identity
    assert ours["backend"] == "onnxruntime"
    assert {k: v for k, v in ours.items() if k != "backend"} == dlib_identity
    bundle_input = {"kind": "dlib-resnet", "network": dlib_identity}
    assert type(encoder_for_bundle(bundle_input, backend="dlib")) is DlibResNetEncoder
    assert isinstance(encoder_for_bundle(bundle_input, cache_dir=onnx_encoder.graph.path.parent), OnnxResNetEncoder)


def test_the_graph_is_built_once_into_the_cache_under_the_network_files_hash(graph_cache, onnx_encoder):
    sha = onnx_encoder.identity["network_sha256"]
    assert onnx_encoder.graph.path == graph_path(graph_cache, sha) and onnx_encoder.graph.path.is_file()
    again = OnnxResNetEncoder(cache_dir=graph_cache)
    assert not again.graph.built  # read from the cache, and checked against dlib all the same
    assert again.graph.max_difference <= TOLERANCE


def test_an_altered_cached_graph_is_refused_by_name(tmp_path, onnx_encoder):
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string(onnx_encoder.graph.path.read_bytes())
    weights = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # the largest tensor: a conv's
    w = numpy_helper.to_array(weights).copy()
    w *= 1.01  # one convolution's weights 1 % larger: descriptors move by about 1e-3, ten times the tolerance
    weights.CopyFrom(numpy_helper.from_array(w, weights.name))
    sha = onnx_encoder.identity["network_sha256"]
    altered = graph_path(tmp_path, sha)
    altered.write_bytes(model.SerializeToString())
    with pytest.raises(DescriptorGraphError) as info:
        OnnxResNetEncoder(cache_dir=tmp_path)
    assert str(altered) in str(info.value) and "differs by" in str(info.value)


def test_a_damaged_cached_graph_is_refused_by_name_and_an_unwritable_cache_still_serves(tmp_path, onnx_encoder):
    sha = onnx_encoder.identity["network_sha256"]
    damaged = graph_path(tmp_path / "damaged", sha)
    damaged.parent.mkdir()
    damaged.write_bytes(onnx_encoder.graph.path.read_bytes()[:100_000])
    with pytest.raises(DescriptorGraphError, match="cannot load"):
        OnnxResNetEncoder(cache_dir=damaged.parent)
    blocked = tmp_path / "a-file-not-a-folder"
    blocked.write_text("")
    fresh = OnnxResNetEncoder(cache_dir=blocked)  # the graph is built and used from memory
    assert fresh.graph.built and not fresh.graph.path.exists()


def test_the_back_end_is_a_setting_named_when_wrong():
    with pytest.raises(ValueError, match="expected one of onnxruntime, dlib, received 'tensorrt'"):
        make_encoder("tensorrt")
    with pytest.raises(ValueError, match="jitter"):
        make_encoder("onnxruntime", jitter=2)
    assert type(make_encoder("dlib")) is DlibResNetEncoder
    assert model_files()["network"].is_file()
