"""A reader of dlib's serialised face recognition ResNet (``dlib_face_recognition_resnet_model_v1.dat``).

dlib writes a network as a nest: the loss layer, then each ``add_layer`` from
the output down to the input writes its version number and recurses into its
sub-network *before* its own details. The file therefore holds every layer's
version number (output→input), then the input layer, then each layer's
details (input→output). Its encodings (checked against the file):

- integers: a control byte whose low nibble is the byte count (1-8) and whose
  bit 7 is the sign (bits 4-6 must be 0), then the magnitude's bytes,
  little-endian; zero is ``01 00``;
- scalar floats (means, multipliers, the loss's margin): dlib's portable
  format, an integer mantissa (int64) and an integer exponent (int16) in the
  encoding above, value ``mantissa * 2**exponent``; exponents 32000, 32001,
  32002 stand for +inf, -inf and NaN;
- strings: their length (integer encoding) then the bytes; each layer's
  details open with a string naming its kind and version (``"con_4"``);
- booleans: the ASCII characters ``'0'`` and ``'1'``;
- tensors (version 2): the four dimensions (num_samples, k, nr, nc), then the
  values as raw little-endian IEEE float32 (not the portable format: dlib
  switched to raw floats for tensors to keep files small); an
  ``alias_tensor`` (a view into a layer's parameter tensor) is a version and
  its four dimensions, no data.

After its details each ``add_layer`` writes its training state: three flags
and three tensors (empty in this file), and the one over the input layer its
sample expansion factor (1).

``add_tag_layer`` and ``add_skip_layer`` write only the version ``1`` and no
details, and ``add_prev_`` writes no tag id either: the file does not say which
layer is a tag and which a skip, nor which tag a skip or an ``add_prev``
reads. :func:`read_network` recovers them by matching dlib's two residual
templates of this network (``residual`` and ``residual_down`` in dlib's
``dnn_face_recognition_ex.cpp``) and refuses a layer sequence that matches
neither.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

__all__ = ["KINDS", "DlibFormatError", "DlibLayer", "DlibNetwork", "read_network"]

#: The layer kinds a :class:`DlibLayer` can have, input to output.
KINDS = (
    "input_rgb_image_sized",
    "con",
    "affine",
    "relu",
    "max_pool",
    "avg_pool",
    "avg_pool_everything",
    "tag",
    "skip",
    "add_prev",
    "fc",
    "fc_no_bias",
    "loss_metric",
)

# Version strings (and integer versions) of the dlib serialisation this reader understands.
_LOSS_VERSION = 1
_ADD_LAYER_VERSION = 2
_INPUT_ADD_LAYER_VERSION = 3
_TAG_OR_SKIP_VERSION = 1
_TENSOR_VERSION = 2
_ALIAS_VERSION = 1
_LOSS = "loss_metric_2"
_INPUT = "input_rgb_image_sized"
_DETAILS = ("con_4", "affine_", "relu_", "max_pool_2", "avg_pool_2", "add_prev_", "fc_2")
# dlib's float_details marks these exponents as inf, -inf, NaN.
_SPECIAL_EXPONENTS = {32000: math.inf, 32001: -math.inf, 32002: math.nan}
# Longest string dlib writes for a layer of this network is 21 bytes; anything far longer is corruption.
_MAX_STRING = 256
# Largest tensor dimension taken at face value (the file's size bounds the product anyway).
_MAX_DIMENSION = 1 << 40
# dlib's input_rgb_image divides by this constant in code (the file stores only the means).
_INPUT_DIVISOR = 256.0
# Placeholder kind until tags and skips are told apart.
_TAG_OR_SKIP = "tag_or_skip"


class DlibFormatError(ValueError):
    """The file is not a dlib network this reader understands.

    Parameters
    ----------
    expected : str
        What the reader expected at ``offset``.
    found : str
        What it found there.
    offset : int
        Byte offset in the file.
    source : str, optional
        The file's path (named in the message).
    """

    def __init__(self, expected: str, found: str, offset: int, source: str = "") -> None:
        self.expected, self.found, self.offset, self.source = expected, found, offset, source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}at byte {offset}: expected {expected}, found {found}")


@dataclass(frozen=True, eq=False)
class DlibLayer:
    """One layer of the network, as dlib computes it.

    Attributes
    ----------
    index : int
        Position in :attr:`DlibNetwork.layers` (0 = the input layer).
    kind : str
        One of :data:`KINDS`.
    offset : int
        Byte offset of the layer's details (its kind string; for a tag or a
        skip, which have none, its version number).
    filters : int or None
        ``con``: number of output channels; ``fc``/``fc_no_bias``: number of outputs.
    kernel, stride, padding : tuple of (int, int) or None
        ``con``, ``max_pool``, ``avg_pool``: (rows, columns). dlib pads
        symmetrically by ``padding`` on each side (zeros for ``con``; a pool's
        padding is left out of its window). ``avg_pool_everything`` has kernel
        (0, 0): the whole image.
    tag : int or None
        ``tag``, ``skip``, ``add_prev``: dlib's tag id (``tag1``/``skip1``/
        ``add_prev1``...). Not stored by dlib: recovered from its residual templates.
    source : int or None
        ``skip`` and ``add_prev``: index of the ``tag`` layer whose input they
        read (a tag passes its input through unchanged).
    arrays : mapping of str to ndarray of float32
        Read-only weights. ``con``: ``weight`` (filters, in_channels, rows,
        columns), correlation as dlib computes it, and ``bias`` (filters,).
        ``affine``: ``gamma`` and ``beta`` (channels,), output
        ``gamma * x + beta`` per channel (batch norm folded by dlib).
        ``fc_no_bias``: ``weight`` (inputs, outputs), output ``x @ weight``
        (``fc`` also has ``bias`` (outputs,)). ``input_rgb_image_sized``:
        ``mean`` (3,), the R, G, B means dlib subtracts.
    values : mapping of str to float
        Scalars of the file: learning-rate and weight-decay multipliers
        (``con``, ``fc``), ``margin`` and ``distance_threshold``
        (``loss_metric``), ``rows``/``columns`` (the input size).
    """

    index: int
    kind: str
    offset: int
    filters: int | None = None
    kernel: tuple[int, int] | None = None
    stride: tuple[int, int] | None = None
    padding: tuple[int, int] | None = None
    tag: int | None = None
    source: int | None = None
    arrays: Mapping[str, NDArray[np.float32]] = field(default_factory=lambda: MappingProxyType({}))
    values: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, eq=False)
class DlibNetwork:
    """A parsed dlib network, layers in input→output order.

    Attributes
    ----------
    layers : tuple of DlibLayer
        ``layers[0]`` is the input layer, ``layers[-1]`` the loss layer.
    input_size : tuple of (int, int)
        (rows, columns) of the image the input layer takes.
    mean : ndarray of float32, shape (3,)
        R, G, B values the input layer subtracts (stored in the file).
    scale : float
        Factor applied after subtracting the mean: 1/256, a constant of dlib's
        ``input_rgb_image`` code (not in the file).
    size : int
        Size of the file in bytes.
    """

    layers: tuple[DlibLayer, ...]
    input_size: tuple[int, int]
    mean: NDArray[np.float32]
    scale: float
    size: int

    def count(self) -> dict[str, int]:
        """Number of layers of each kind, in :data:`KINDS` order."""
        counts = {kind: sum(layer.kind == kind for layer in self.layers) for kind in KINDS}
        return {kind: n for kind, n in counts.items() if n}


class _Reader:
    """Bounded cursor over the file's bytes: every read checks what is left first."""

    def __init__(self, data: bytes, source: str) -> None:
        self.data = data
        self.pos = 0
        self.source = source

    def fail(self, expected: str, found: str, offset: int | None = None) -> DlibFormatError:
        return DlibFormatError(expected, found, self.pos if offset is None else offset, self.source)

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise self.fail(f"{what} ({n} bytes)", f"only {self.left()} bytes before the end (truncated file)")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def integer(self, what: str, *, max_bytes: int = 8, signed: bool = True) -> int:
        start = self.pos
        control = self.take(1, what)[0]
        n = control & 0x0F
        if control & 0x70 or not 1 <= n <= max_bytes:
            raise self.fail(
                f"{what} (an integer's control byte: 1-{max_bytes} bytes, bits 4-6 clear)", f"0x{control:02x}", start
            )
        value = int.from_bytes(self.take(n, what), "little")
        if control & 0x80:
            if not signed:
                raise self.fail(f"{what} (a non-negative integer)", f"-{value}", start)
            value = -value
        return value

    def count(self, what: str, limit: int) -> int:
        start = self.pos
        value = self.integer(what)
        if not 0 <= value <= limit:
            raise self.fail(f"{what} between 0 and {limit}", str(value), start)
        return value

    def version(self, what: str, allowed: tuple[int, ...]) -> int:
        start = self.pos
        value = self.integer(what, max_bytes=4)
        if value not in allowed:
            raise self.fail(f"{what} version {' or '.join(map(str, allowed))}", str(value), start)
        return value

    def real(self, what: str) -> float:
        mantissa = self.integer(f"{what} (mantissa)")
        exponent = self.integer(f"{what} (exponent)", max_bytes=2)
        if exponent in _SPECIAL_EXPONENTS:
            return _SPECIAL_EXPONENTS[exponent]
        if not mantissa:
            # dlib writes 0.0 with a mantissa of 0 and an arbitrary exponent (11 in this file).
            return 0.0
        try:
            return math.ldexp(float(mantissa), exponent)
        except OverflowError:
            raise self.fail(f"{what}: a float within double range", f"{mantissa} * 2**{exponent}") from None

    def string(self, what: str) -> str:
        start = self.pos
        n = self.integer(f"{what} (length)", signed=False)
        if n > min(_MAX_STRING, self.left()):
            why = "truncated file" if n > self.left() else "implausible length"
            raise self.fail(
                f"{what}: a string of at most {min(_MAX_STRING, self.left())} bytes", f"length {n} ({why})", start
            )
        raw = self.take(n, what)
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            raise self.fail(f"{what}: an ASCII string", repr(raw[:32]), start) from None

    def boolean(self, what: str) -> bool:
        start = self.pos
        ch = self.take(1, what)
        if ch not in (b"0", b"1"):
            raise self.fail(f"{what}: '0' or '1'", repr(ch), start)
        return ch == b"1"

    def dims(self, what: str, limit: int) -> tuple[int, int, int, int]:
        n, k, r, c = (self.count(f"{what} {axis}", limit) for axis in ("num_samples", "k", "nr", "nc"))
        return n, k, r, c

    def tensor(self, what: str) -> tuple[tuple[int, int, int, int], NDArray[np.float32]]:
        self.version(f"{what}: tensor", (_TENSOR_VERSION,))
        start = self.pos
        shape = self.dims(what, _MAX_DIMENSION)
        n = math.prod(shape)
        # Checked before anything is allocated: the values must be in the file.
        if 4 * n > self.left():
            raise self.fail(
                f"{what}: a tensor of at most {self.left() // 4} floats (what the rest of the file holds)",
                f"shape {shape} ({n} floats: truncated file or implausible size)",
                start,
            )
        values = np.frombuffer(self.take(4 * n, what), dtype="<f4").astype(np.float32)
        values.setflags(write=False)
        return shape, values

    def alias(self, what: str, params: int) -> tuple[int, int, int, int]:
        # A view into a parameter tensor of `params` values: no dimension can exceed that.
        self.version(f"{what}: alias tensor", (_ALIAS_VERSION,))
        return self.dims(what, max(params, 1))


def _frozen(arrays: Mapping[str, NDArray[np.float32]]) -> Mapping[str, NDArray[np.float32]]:
    out = {}
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        a.setflags(write=False)
        out[name] = a
    return MappingProxyType(out)


def _expect_size(rd: _Reader, what: str, got: int, want: int, offset: int) -> None:
    if got != want:
        raise rd.fail(f"{what} of {want} values", f"{got}", offset)


def _con(rd: _Reader, index: int, offset: int) -> DlibLayer:
    p_at = rd.pos
    _, params = rd.tensor("con: params")
    filters = rd.count("con: num_filters", params.size)
    nr, nc, sy, sx = (rd.count(f"con: {w}", params.size) for w in ("nr", "nc", "stride_y", "stride_x"))
    py, px = rd.count("con: padding_y", nr), rd.count("con: padding_x", nc)
    if sy < 1 or sx < 1:
        raise rd.fail("con: strides of at least 1", f"({sy}, {sx})", offset)
    f_at = rd.pos
    f = rd.alias("con: filters", params.size)
    if f[0] != filters or f[2:] != (nr, nc):
        raise rd.fail(f"con: filters of shape ({filters}, k, {nr}, {nc})", f"shape {f}", f_at)
    b_at = rd.pos
    b = rd.alias("con: biases", params.size)
    if math.prod(b) != filters:
        raise rd.fail(f"con: {filters} biases", f"shape {b}", b_at)
    _expect_size(rd, "con: params (filters then biases)", params.size, math.prod(f) + filters, p_at)
    names = ("learning_rate_multiplier", "weight_decay_multiplier")
    multipliers = [rd.real(f"con: {n}") for n in (*names, *(f"bias_{n}" for n in names))]
    split = math.prod(f)
    return DlibLayer(
        index,
        "con",
        offset,
        filters=filters,
        kernel=(nr, nc),
        stride=(sy, sx),
        padding=(py, px),
        arrays=_frozen({"weight": params[:split].reshape(f), "bias": params[split:]}),
        values=MappingProxyType(dict(zip((*names, *(f"bias_{n}" for n in names)), multipliers, strict=True))),
    )


def _affine(rd: _Reader, index: int, offset: int) -> DlibLayer:
    p_at = rd.pos
    _, params = rd.tensor("affine: params")
    g_at = rd.pos
    g = rd.alias("affine: gamma", params.size)
    b = rd.alias("affine: beta", params.size)
    if g != b or g[0] != 1 or g[2:] != (1, 1):
        raise rd.fail("affine: gamma and beta of shape (1, channels, 1, 1) (per-channel)", f"{g} and {b}", g_at)
    _expect_size(rd, "affine: params (gamma then beta)", params.size, 2 * g[1], p_at)
    m_at = rd.pos
    mode = rd.integer("affine: mode", max_bytes=4)
    if mode != 0:
        # dlib's CONV_MODE is 0: one gamma and beta per channel.
        raise rd.fail("affine: mode 0 (CONV_MODE, per channel)", str(mode), m_at)
    k = g[1]
    return DlibLayer(index, "affine", offset, arrays=_frozen({"gamma": params[:k], "beta": params[k:]}))


def _pool(rd: _Reader, index: int, offset: int, kind: str) -> DlibLayer:
    nr, nc, sy, sx, py, px = (
        rd.count(f"{kind}: {w}", 1 << 16) for w in ("nr", "nc", "stride_y", "stride_x", "padding_y", "padding_x")
    )
    if sy < 1 or sx < 1:
        raise rd.fail(f"{kind}: strides of at least 1", f"({sy}, {sx})", offset)
    if kind == "avg_pool" and (nr, nc) == (0, 0):
        # avg_pool<0,0,1,1>: a window of the whole image.
        kind = "avg_pool_everything"
    elif nr < 1 or nc < 1 or py >= nr or px >= nc:
        raise rd.fail(
            f"{kind}: a window of at least 1×1 and padding smaller than it", f"({nr}, {nc}, {py}, {px})", offset
        )
    return DlibLayer(index, kind, offset, kernel=(nr, nc), stride=(sy, sx), padding=(py, px))


def _fc(rd: _Reader, index: int, offset: int) -> DlibLayer:
    outputs = rd.count("fc: num_outputs", max(rd.left() // 4, 1))
    inputs = rd.count("fc: num_inputs", max(rd.left() // 4, 1))
    p_at = rd.pos
    _, params = rd.tensor("fc: params")
    w_at = rd.pos
    w = rd.alias("fc: weights", params.size)
    if w != (inputs, outputs, 1, 1):
        raise rd.fail(f"fc: weights of shape ({inputs}, {outputs}, 1, 1)", f"shape {w}", w_at)
    b_at = rd.pos
    b = rd.alias("fc: biases", params.size)
    m_at = rd.pos
    mode = rd.integer("fc: bias_mode", max_bytes=4)
    # dlib's fc_bias_mode: FC_HAS_BIAS = 0, FC_NO_BIAS = 1.
    if mode not in (0, 1):
        raise rd.fail("fc: bias_mode 0 (FC_HAS_BIAS) or 1 (FC_NO_BIAS)", str(mode), m_at)
    n_bias = outputs if mode == 0 else 0
    if math.prod(b) != n_bias:
        raise rd.fail(f"fc: {n_bias} biases", f"shape {b}", b_at)
    _expect_size(rd, "fc: params (weights then biases)", params.size, inputs * outputs + n_bias, p_at)
    names = ("learning_rate_multiplier", "weight_decay_multiplier")
    multipliers = [rd.real(f"fc: {n}") for n in (*names, *(f"bias_{n}" for n in names))]
    arrays = {"weight": params[: inputs * outputs].reshape(inputs, outputs)}
    if mode == 0:
        arrays["bias"] = params[inputs * outputs :]
    return DlibLayer(
        index,
        "fc" if mode == 0 else "fc_no_bias",
        offset,
        filters=outputs,
        arrays=_frozen(arrays),
        values=MappingProxyType(dict(zip((*names, *(f"bias_{n}" for n in names)), multipliers, strict=True))),
    )


def _details(rd: _Reader, index: int) -> DlibLayer:
    offset = rd.pos
    name = rd.string("a layer's details")
    if name not in _DETAILS:
        raise rd.fail(f"a layer kind and version, one of {', '.join(map(repr, _DETAILS))}", repr(name), offset)
    if name == "con_4":
        return _con(rd, index, offset)
    if name == "affine_":
        return _affine(rd, index, offset)
    if name in ("max_pool_2", "avg_pool_2"):
        return _pool(rd, index, offset, name[:-2])
    if name == "fc_2":
        return _fc(rd, index, offset)
    return DlibLayer(index, "relu" if name == "relu_" else "add_prev", offset)


def _state(rd: _Reader, what: str, *, input_layer: bool) -> None:
    # Training state written after each layer's details: three flags and three (normally empty) tensors.
    for flag in ("this_layer_setup_called", "gradient_input_is_stale", "get_output_and_gradient_input_disabled"):
        rd.boolean(f"{what}: {flag}")
    for t in ("x_grad", "cached_output", "grad_final" if input_layer else "params_grad"):
        rd.tensor(f"{what}: {t}")
    if input_layer:
        at = rd.pos
        factor = rd.integer(f"{what}: sample_expansion_factor")
        if factor != 1:
            raise rd.fail(f"{what}: sample_expansion_factor 1 (one tensor sample per image)", str(factor), at)


# dlib's residual templates as the file shows them (input→output); "?" is a tag or a skip.
_RESIDUAL = ("?", "con", "affine", "relu", "con", "affine", "add_prev")
_RESIDUAL_DOWN = ("?", "con", "affine", "relu", "con", "affine", "?", "?", "avg_pool", "add_prev")


def _resolve(rd: _Reader, layers: list[DlibLayer]) -> list[DlibLayer]:
    """Tell tags from skips and link skips and add_prevs to their tags, from dlib's residual templates.

    ``residual``: ``add_prev1<block<tag1<x>>>``; ``residual_down``:
    ``add_prev2<avg_pool<skip1<tag2<block<tag1<x>>>>>>``.
    """
    kinds = tuple("?" if layer.kind == _TAG_OR_SKIP else layer.kind for layer in layers)
    out = list(layers)

    def put(j: int, kind: str, tag: int, source: int | None = None) -> None:
        out[j] = DlibLayer(out[j].index, kind, out[j].offset, tag=tag, source=source)

    i = 0
    while i < len(out):
        if kinds[i] != "?":
            if kinds[i] == "add_prev":
                raise rd.fail(
                    "an add_prev closing one of dlib's residual templates", "an unmatched add_prev", out[i].offset
                )
            i += 1
            continue

        if kinds[i : i + len(_RESIDUAL_DOWN)] == _RESIDUAL_DOWN:
            put(i, "tag", 1)
            put(i + 6, "tag", 2)
            put(i + 7, "skip", 1, i)
            put(i + 9, "add_prev", 2, i + 6)
            i += len(_RESIDUAL_DOWN)
        elif kinds[i : i + len(_RESIDUAL)] == _RESIDUAL:
            put(i, "tag", 1)
            put(i + 6, "add_prev", 1, i)
            i += len(_RESIDUAL)
        else:
            found = " ".join(kinds[i : i + len(_RESIDUAL_DOWN)])
            raise rd.fail(
                "a tag or skip opening dlib's residual template (? con affine relu con affine add_prev) or "
                "residual_down (? con affine relu con affine ? ? avg_pool add_prev), ? = tag or skip",
                found,
                out[i].offset,
            )
    return out


def read_network(path: str | Path) -> DlibNetwork:
    """Parse dlib's ``dlib_face_recognition_resnet_model_v1.dat`` (a ``loss_metric`` ResNet).

    Parameters
    ----------
    path : str or Path
        The ``.dat`` file (dlib's own serialisation, uncompressed).

    Returns
    -------
    DlibNetwork
        Layers input→output, with weights as read-only float32 arrays.

    Raises
    ------
    DlibFormatError
        The file is truncated, has trailing bytes, an unknown or unexpected
        version (integer or string), an implausible size, or a layer sequence
        whose tags and skips cannot be resolved; the message names what was
        expected, what was found and the byte offset.
    OSError
        The file cannot be read.
    """
    return _parse(Path(path).read_bytes(), str(path))


def _parse(data: bytes, source: str) -> DlibNetwork:
    rd = _Reader(data, source)

    rd.version("loss layer", (_LOSS_VERSION,))
    loss_at = rd.pos
    name = rd.string("the loss layer's details")
    if name != _LOSS:
        raise rd.fail(f"loss layer {_LOSS!r}", repr(name), loss_at)
    loss = {"margin": rd.real("loss_metric: margin"), "distance_threshold": rd.real("loss_metric: dist_thresh")}

    # Versions, output→input, up to the add_layer that holds the input layer. Each takes >= 2 bytes: bounded.
    versions: list[tuple[int, int]] = []
    while True:
        at = rd.pos
        v = rd.version(
            "a layer (add_layer 2, tag or skip 1, add_layer over the input 3)",
            (_ADD_LAYER_VERSION, _TAG_OR_SKIP_VERSION, _INPUT_ADD_LAYER_VERSION),
        )
        versions.append((v, at))
        if v == _INPUT_ADD_LAYER_VERSION:
            break

    in_at = rd.pos
    name = rd.string("the input layer's details")
    if name != _INPUT:
        raise rd.fail(f"input layer {_INPUT!r}", repr(name), in_at)
    mean = np.array([rd.real(f"input: avg_{c}") for c in ("red", "green", "blue")], dtype=np.float32)
    rows, cols = rd.count("input: nr", 1 << 16), rd.count("input: nc", 1 << 16)
    if not np.all(np.isfinite(mean)) or rows < 1 or cols < 1:
        raise rd.fail("input: finite means and a size of at least 1×1", f"means {mean}, size {rows}×{cols}", in_at)
    mean.setflags(write=False)
    layers = [
        DlibLayer(
            0,
            "input_rgb_image_sized",
            in_at,
            arrays=_frozen({"mean": mean}),
            values=MappingProxyType({"rows": float(rows), "columns": float(cols)}),
        )
    ]
    for v, at in reversed(versions):
        if v == _TAG_OR_SKIP_VERSION:
            layers.append(DlibLayer(len(layers), _TAG_OR_SKIP, at))
            continue
        layer = _details(rd, len(layers))
        _state(rd, layer.kind, input_layer=v == _INPUT_ADD_LAYER_VERSION)
        layers.append(layer)
    if rd.left():
        raise rd.fail("the end of the file after the last layer", f"{rd.left()} trailing bytes")
    layers = _resolve(rd, layers)
    layers.append(DlibLayer(len(layers), "loss_metric", loss_at, values=MappingProxyType(loss)))
    return DlibNetwork(
        layers=tuple(layers), input_size=(rows, cols), mean=mean, scale=1.0 / _INPUT_DIVISOR, size=len(data)
    )
