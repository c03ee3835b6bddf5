"""dlib's face recognition ResNet as an ONNX graph (see :mod:`peep.edge.dlibdat` for the file).

:func:`build_graph` turns a parsed :class:`~peep.edge.dlibdat.DlibNetwork` into
an ONNX model that computes, from 150×150 aligned face chips (``dlib.get_face_chip``),
the 128-d descriptor ``dlib.face_recognition_model_v1.compute_face_descriptor``
returns. The graph follows dlib's arithmetic layer by layer (no folding of the
affine layers into the convolutions) so that it stays within float32 rounding
of dlib's own forward pass:

- input: ``(pixel - mean[channel]) / 256`` with the R, G, B means of the file
  (``input_rgb_image``), exactly as dlib computes it in float32;
- ``con``: cross-correlation with zero padding ``padding`` on each side; dlib's
  default (which this file's values follow) is ``kernel // 2`` for stride 1
  and 0 otherwise, so a stride-2 3×3 convolution drops the last row and
  column of an even-sized input;
- ``max_pool`` and ``avg_pool``: output size ``1 + (size + 2 * padding - window) // stride``
  (floor), padding left out of the window (``count_include_pad = 0``);
- ``add_prev``: when its two inputs differ in channels or size (the
  downsampling blocks: the average-pooled shortcut has fewer channels, and at
  8×8 → 4×4 and 4×4 → 2×2 it is *larger* than the stride-2 convolution's
  3×3 and 1×1 output), dlib's ``add`` sums them into the larger shape along
  every axis, reading the smaller one as zeros beyond its end (padding after,
  never before);
- ``fc_no_bias``: ``x @ weight`` on the flattened (N, channels·rows·columns) input;
- ``loss_metric``: the descriptor is the ``fc`` output itself (not normalised).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.edge.dlibdat import DlibLayer, DlibNetwork

__all__ = ["INPUT", "OUTPUT", "build_graph"]

#: Name of the graph's input: uint8 RGB face chips, shape (N, rows, columns, 3).
INPUT = "chips"
#: Name of the graph's output: float32 descriptors, shape (N, outputs of the last fc layer).
OUTPUT = "descriptors"

_OPSET = 17
_IR_VERSION = 8
_PRODUCER = "peep.edge.dlibgraph"
_PRODUCER_VERSION = "1"


def _out_size(size: int, window: int, stride: int, padding: int, what: str) -> int:
    span = size + 2 * padding - window
    if span < 0:
        raise ValueError(f"{what}: a window of {window} with padding {padding} does not fit an input of {size}")
    return 1 + span // stride


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.initializers: dict[str, NDArray[Any]] = {}

    def const(self, name: str, value: NDArray[Any]) -> str:
        if name in self.initializers:
            raise ValueError(f"dlib graph: initializer {name!r} defined twice")
        self.initializers[name] = value
        return name

    def node(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output


def _geometry(layer: DlibLayer) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    if layer.kernel is None or layer.stride is None or layer.padding is None:
        raise ValueError(f"layer {layer.index} ({layer.kind}): kernel, stride and padding are required")
    return layer.kernel, layer.stride, layer.padding


def _layer(b: _Builder, layer: DlibLayer, x: str, shape: tuple[int, int, int]) -> tuple[str, tuple[int, int, int]]:
    """One compute layer (not tag/skip/add_prev): its output name and (channels, rows, columns)."""
    name = f"l{layer.index:03d}_{layer.kind}"
    c, h, w = shape
    if layer.kind == "con":
        weight = layer.arrays["weight"]
        if weight.shape[1] != c:
            raise ValueError(f"{name}: filters expect {weight.shape[1]} input channels, the input has {c}")
        (kh, kw), (sy, sx), (py, px) = _geometry(layer)
        out = b.node(
            "Conv",
            [x, b.const(f"{name}_weight", weight), b.const(f"{name}_bias", layer.arrays["bias"])],
            name,
            kernel_shape=[kh, kw],
            strides=[sy, sx],
            pads=[py, px, py, px],
        )
        return out, (weight.shape[0], _out_size(h, kh, sy, py, name), _out_size(w, kw, sx, px, name))
    if layer.kind == "affine":
        gamma, beta = layer.arrays["gamma"], layer.arrays["beta"]
        if gamma.shape != (c,):
            raise ValueError(f"{name}: {gamma.shape[0]} channels, the input has {c}")
        scaled = b.node("Mul", [x, b.const(f"{name}_gamma", gamma.reshape(1, c, 1, 1))], f"{name}_scaled")
        return b.node("Add", [scaled, b.const(f"{name}_beta", beta.reshape(1, c, 1, 1))], name), shape
    if layer.kind == "relu":
        return b.node("Relu", [x], name), shape
    if layer.kind in ("max_pool", "avg_pool"):
        (kh, kw), (sy, sx), (py, px) = _geometry(layer)
        attrs: dict[str, Any] = {"kernel_shape": [kh, kw], "strides": [sy, sx], "pads": [py, px, py, px]}
        if layer.kind == "avg_pool":
            # dlib averages over the window's pixels inside the image only (moot here: no pool of this file pads).
            attrs["count_include_pad"] = 0
        op = "MaxPool" if layer.kind == "max_pool" else "AveragePool"
        out = b.node(op, [x], name, **attrs)
        return out, (c, _out_size(h, kh, sy, py, name), _out_size(w, kw, sx, px, name))
    if layer.kind == "avg_pool_everything":
        if layer.stride != (1, 1) or layer.padding != (0, 0):
            raise ValueError(
                f"{name}: a whole-image average with stride 1 and no padding, "
                f"got stride {layer.stride} and padding {layer.padding}"
            )
        return b.node("GlobalAveragePool", [x], name), (c, 1, 1)
    if layer.kind in ("fc", "fc_no_bias"):
        weight = layer.arrays["weight"]
        if weight.shape[0] != c * h * w:
            raise ValueError(f"{name}: {weight.shape[0]} inputs, the input has {c}×{h}×{w}")
        flat = b.node("Flatten", [x], f"{name}_flat", axis=1)
        out = b.node("MatMul", [flat, b.const(f"{name}_weight", weight)], name)
        if layer.kind == "fc":
            out = b.node("Add", [out, b.const(f"{name}_bias_value", layer.arrays["bias"])], f"{name}_bias")
        return out, (weight.shape[1], 1, 1)
    raise ValueError(f"{name}: layer kind {layer.kind!r} has no ONNX translation")


def _grow(b: _Builder, x: str, shape: tuple[int, int, int], target: tuple[int, int, int], name: str) -> str:
    """Zero-pad ``x`` after its end along channels, rows and columns up to ``target`` (dlib's ``add``)."""
    if shape == target:
        return x
    extra = [t - s for s, t in zip(shape, target, strict=True)]
    pads = np.array([0, 0, 0, 0, 0, *extra], dtype=np.int64)
    return b.node("Pad", [x, b.const(f"{name}_pads", pads)], name, mode="constant")


def build_graph(network: DlibNetwork) -> bytes:
    """Serialised ONNX model of ``network``: face chips in, dlib's descriptors out.

    Parameters
    ----------
    network : DlibNetwork
        From :func:`peep.edge.dlibdat.read_network`: an ``input_rgb_image_sized``
        layer first and a ``loss_metric`` last.

    Returns
    -------
    bytes
        An ONNX ``ModelProto`` (opset 17) with input ``chips``, uint8 of shape
        (N, rows, columns, 3), RGB, the aligned chips ``dlib.get_face_chip``
        makes (150×150 for this network), and output ``descriptors``, float32
        of shape (N, 128): what ``compute_face_descriptor(chip)`` returns for
        each chip. Deterministic: the same network gives the same bytes.

    Raises
    ------
    ValueError
        The network is not a chain this graph builder can translate (wrong
        first or last layer, shapes that do not fit, an unknown kind).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    layers = network.layers
    if not layers or layers[0].kind != "input_rgb_image_sized" or layers[-1].kind != "loss_metric":
        raise ValueError("dlib graph: expected an input_rgb_image_sized layer first and a loss_metric layer last")
    rows, cols = network.input_size
    b = _Builder()
    pixels = b.node("Cast", [INPUT], "input_float", to=TensorProto.FLOAT)
    planar = b.node("Transpose", [pixels], "input_nchw", perm=[0, 3, 1, 2])
    centred = b.node(
        "Sub", [planar, b.const("input_mean", network.mean.astype(np.float32).reshape(1, 3, 1, 1))], "input_centred"
    )
    # dlib divides by 256 (exact in binary), so multiplying by 1/256 gives the same float32.
    x = b.node("Mul", [centred, b.const("input_scale", np.array(network.scale, dtype=np.float32))], "l000_input")
    shape = (3, rows, cols)
    # What each tag passes through (its input), by layer index, for the skips and add_prevs that read it.
    tagged: dict[int, tuple[str, tuple[int, int, int]]] = {}
    for layer in layers[1:-1]:
        if layer.kind == "tag":
            tagged[layer.index] = (x, shape)
        elif layer.kind == "skip":
            if layer.source not in tagged:
                raise ValueError(f"layer {layer.index}: skip to layer {layer.source}, which is not a tag below it")
            x, shape = tagged[layer.source]
        elif layer.kind == "add_prev":
            if layer.source not in tagged:
                raise ValueError(f"layer {layer.index}: add_prev of layer {layer.source}, which is not a tag below it")
            other, other_shape = tagged[layer.source]
            name = f"l{layer.index:03d}_add_prev"
            target = (
                max(shape[0], other_shape[0]),
                max(shape[1], other_shape[1]),
                max(shape[2], other_shape[2]),
            )
            left = _grow(b, x, shape, target, f"{name}_grown")
            right = _grow(b, other, other_shape, target, f"{name}_tag_grown")
            x, shape = b.node("Add", [left, right], name), target
        else:
            x, shape = _layer(b, layer, x, shape)
    if shape[1:] != (1, 1):
        raise ValueError(f"dlib graph: the loss layer expects a vector per chip, the network gives {shape}")
    b.node("Identity", [x], OUTPUT)

    graph = helper.make_graph(
        b.nodes,
        "dlib_face_recognition_resnet",
        [helper.make_tensor_value_info(INPUT, TensorProto.UINT8, ["N", rows, cols, 3])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["N", shape[0]])],
        initializer=[numpy_helper.from_array(np.ascontiguousarray(v), name) for name, v in b.initializers.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", _OPSET)],
        producer_name=_PRODUCER,
        producer_version=_PRODUCER_VERSION,
        doc_string="dlib face recognition ResNet: RGB face chips -> 128-d descriptors (dlib's arithmetic)",
    )
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data
