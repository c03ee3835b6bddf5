"""Our reader of dlib's face ResNet file and its ONNX graph, against dlib itself.

The network file comes from the installed ``face_recognition_models`` (extra
``peep-edge[dlib]``); corrupted copies are written to ``tmp_path``. The file is
parsed and the graph built once per module.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

dlib = pytest.importorskip("dlib", reason="dlib (extra peep-edge[dlib]) is not installed")
pytest.importorskip("onnx", reason="onnx is not installed")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
_SPEC = importlib.util.find_spec("face_recognition_models")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("face_recognition_models (extra peep-edge[dlib]) is not installed", allow_module_level=True)

from peep.edge.dlibdat import DlibFormatError, DlibNetwork, read_network  # noqa: E402
from peep.edge.dlibgraph import INPUT, OUTPUT, build_graph  # noqa: E402

MODELS = Path(next(iter(_SPEC.submodule_search_locations))) / "models"
NETWORK = MODELS / "dlib_face_recognition_resnet_model_v1.dat"
LANDMARKS = MODELS / "shape_predictor_5_face_landmarks.dat"


@pytest.fixture(scope="module")
def network() -> DlibNetwork:
    return read_network(NETWORK)


@pytest.fixture(scope="module")
def graph(network: DlibNetwork) -> bytes:
    return build_graph(network)


@pytest.fixture(scope="module")
def raw() -> bytes:
    return NETWORK.read_bytes()


def _refused(tmp_path: Path, data: bytes) -> DlibFormatError:
    path = tmp_path / "altered.dat"
    path.write_bytes(data)
    with pytest.raises(DlibFormatError) as info:
        read_network(path)
    assert str(path) in str(info.value)
    return info.value


def test_parses_dlibs_resnet(network: DlibNetwork) -> None:
    assert network.count() == {
        "input_rgb_image_sized": 1,
        "con": 29,
        "affine": 29,
        "relu": 29,
        "max_pool": 1,
        "avg_pool": 4,
        "avg_pool_everything": 1,
        "tag": 18,
        "skip": 4,
        "add_prev": 14,
        "fc_no_bias": 1,
        "loss_metric": 1,
    }
    assert network.input_size == (150, 150)
    np.testing.assert_allclose(network.mean, [122.782, 117.001, 104.298], atol=1e-4)
    first = network.layers[1]
    assert (first.kind, first.kernel, first.stride, first.padding) == ("con", (7, 7), (2, 2), (0, 0))
    assert first.arrays["weight"].shape == (32, 3, 7, 7) and first.arrays["bias"].shape == (32,)
    assert not first.arrays["weight"].flags.writeable
    fc = network.layers[-2]
    assert fc.kind == "fc_no_bias" and fc.arrays["weight"].shape == (256, 128)
    for layer in network.layers:
        if layer.kind in ("skip", "add_prev"):
            assert layer.source is not None and network.layers[layer.source].kind == "tag"


def test_refuses_a_truncated_file(tmp_path: Path, raw: bytes) -> None:
    for cut in (len(raw) // 2, 300, len(raw) - 1):
        err = _refused(tmp_path, raw[:cut])
        assert "truncated" in err.found and err.offset <= cut


def test_refuses_trailing_bytes(tmp_path: Path, raw: bytes) -> None:
    err = _refused(tmp_path, raw + b"\x00")
    assert "trailing" in err.found and err.offset == len(raw)


def test_refuses_an_unknown_layer_version_string(tmp_path: Path, raw: bytes) -> None:
    name = raw.index(b"con_4")
    at = name - 2  # the string's length: control byte 01, then 05
    assert raw[at:name] == b"\x01\x05"
    err = _refused(tmp_path, raw[:name] + b"con_9" + raw[name + 5 :])
    assert err.offset == at and "'con_9'" in err.found and "'con_4'" in err.expected


def test_refuses_an_unknown_layer_version_number(tmp_path: Path, raw: bytes) -> None:
    assert raw[:2] == b"\x01\x01"  # the loss layer's version 1
    err = _refused(tmp_path, b"\x01\x07" + raw[2:])
    assert err.offset == 0 and err.found == "7" and "version 1" in err.expected


def test_refuses_an_implausible_tensor_size(tmp_path: Path, raw: bytes) -> None:
    at = raw.index(b"con_4") + 5 + 2  # after the string, the params tensor's version: its num_samples
    assert raw[at : at + 3] == b"\x02\x80\x12"  # 4736 = 32 * 3 * 7 * 7 + 32
    err = _refused(tmp_path, raw[:at] + b"\x04\x80\x12\x00\x40" + raw[at + 3 :])  # 2**30 + 4736
    assert err.offset == at and "con: params: a tensor" in err.expected
    assert f"shape ({2**30 + 4736}, 1, 1, 1)" in err.found and "implausible size" in err.found


def test_graph_is_deterministic(network: DlibNetwork, graph: bytes) -> None:
    assert build_graph(network) == graph


def _chips(data_home: str) -> np.ndarray:
    """Six LFW faces (dlib's detector, 5-point landmarks, 150×150 chips) and two seeded noise chips."""
    detector = dlib.get_frontal_face_detector()
    landmarks = dlib.shape_predictor(str(LANDMARKS))
    people = sorted((Path(data_home) / "lfw_home" / "lfw_funneled").iterdir())
    chips = []
    for person in people[::25]:
        rgb = dlib.load_rgb_image(str(sorted(person.glob("*.jpg"))[0]))
        boxes = detector(rgb, 0)
        if boxes:
            box = max(boxes, key=lambda r: r.area())
            chips.append(dlib.get_face_chip(rgb, landmarks(rgb, box), size=150, padding=0.25))
        if len(chips) == 6:
            break
    assert len(chips) == 6
    rng = np.random.default_rng(20260)
    chips += list(rng.integers(0, 256, size=(2, 150, 150, 3), dtype=np.uint8))
    return np.stack(chips).astype(np.uint8)


def test_graph_equals_dlib(graph: bytes, data_home: str) -> None:
    chips = _chips(data_home)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, inp.shape[1:]) == (INPUT, "tensor(uint8)", [150, 150, 3])
    assert (out.name, out.type, out.shape[1:]) == (OUTPUT, "tensor(float)", [128])

    got = session.run(None, {INPUT: chips})[0]
    net = dlib.face_recognition_model_v1(str(NETWORK))
    want = np.stack([np.asarray(net.compute_face_descriptor(chip)) for chip in chips])
    assert got.shape == (8, 128) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
