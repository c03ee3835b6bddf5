"""Exporting a fitted recogniser: the ONNX model the server serves, and what ``model.json`` says about it.

The fitted pipeline is exported to ONNX (MLPs by skl2onnx, linear models as
MatMul + Add + Softmax, see :func:`export_onnx`) and served with
onnxruntime; :func:`check_onnx_agreement` refuses a model whose ONNX
predictions disagree with scikit-learn's, and the trainer
(:meth:`peep.server.recognition.trainer.Trainer.train`) does not promote it.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from peep.server.recognition.linear import linear_parts
from peep.server.recognition.presets import TrainingError

if TYPE_CHECKING:
    # Only for annotations: fitting imports this module to tell a linear pipeline.
    from peep.server.recognition.fitting import FittedRecogniser


def _linear_onnx(W: NDArray[np.float64], b: NDArray[np.float64]) -> bytes:
    """``values`` (N, d) float32 -> ``probabilities`` = softmax(values · W + b), ``label`` = argmax (int64)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    d, c = W.shape
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["values", "W"], ["z0"]),
            helper.make_node("Add", ["z0", "b"], ["z"]),
            helper.make_node("Softmax", ["z"], ["probabilities"], axis=1),
            helper.make_node("ArgMax", ["z"], ["label"], axis=1, keepdims=0),
        ],
        "peep_linear_recogniser",
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, [None, d])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, c]),
        ],
        initializer=[
            numpy_helper.from_array(W.astype(np.float32), "W"),
            numpy_helper.from_array(b.astype(np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="peep")
    model.ir_version = 8
    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data


def export_onnx(fitted: FittedRecogniser, n_components: int) -> bytes:
    """The fitted pipeline as ONNX: input ``values`` (N, nc) float32 -> ``label``, ``probabilities`` (N, C).

    Linear pipelines (see :func:`linear_parts`: shrinkage LDA, logistic
    regression) are written as the graph they are, MatMul + Add + Softmax,
    with the scaler folded into the weights: skl2onnx's converter for LDA
    gets two-class probabilities wrong (measured: 2.4e-4 off, beyond
    :func:`check_onnx_agreement`'s tolerance, for a subject plus background).
    Everything else (the MLPs) goes through skl2onnx.
    """
    parts = linear_parts(fitted.pipeline)
    if parts is not None:
        W, b = parts
        if W.shape[0] != n_components:
            raise TrainingError(f"onnx: expected a model of {n_components} inputs, received one of {W.shape[0]}")
        return _linear_onnx(W, b)
    from skl2onnx import to_onnx

    clf = fitted.pipeline.steps[-1][1]
    sample = np.zeros((1, n_components), dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = to_onnx(
            fitted.pipeline,
            sample,
            options={id(clf): {"zipmap": False}},
            target_opset={"": 18, "ai.onnx.ml": 3},
            final_types=None,
        )
    graph = model.graph
    graph.input[0].name, old_in = "values", graph.input[0].name
    for node in graph.node:
        node.input[:] = ["values" if n == old_in else n for n in node.input]
    data: bytes = model.SerializeToString()
    return data


def onnx_session(model: bytes, *, threads: int = 1) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


def onnx_probabilities(session: Any, X: NDArray[np.float32]) -> NDArray[np.float32]:
    out = session.run(["probabilities"], {"values": np.ascontiguousarray(X, dtype=np.float32)})[0]
    return np.asarray(out, dtype=np.float32)


def check_onnx_agreement(fitted: FittedRecogniser, model: bytes, *, atol: float = 1e-4) -> dict[str, float]:
    """Compare onnxruntime with scikit-learn on the validation templates.

    Raises :class:`TrainingError` when a probability differs by more than
    ``atol`` or a decision (argmax) differs where scikit-learn's top two
    classes are more than ``10·atol`` apart.
    """
    sess = onnx_session(model)
    X = fitted.val_values
    P_sk = fitted.val_probabilities
    P_ox = onnx_probabilities(sess, X).astype(np.float64)
    if P_ox.shape != P_sk.shape:
        raise TrainingError(f"onnx: expected probabilities of shape {P_sk.shape}, received {P_ox.shape}")
    diff = float(np.max(np.abs(P_ox - P_sk))) if P_sk.size else 0.0
    top2 = np.sort(P_sk, axis=1)[:, -2:] if P_sk.shape[1] >= 2 else np.zeros((len(P_sk), 2))
    clear = (top2[:, 1] - top2[:, 0]) > 10 * atol
    disagree = int(np.sum((P_ox.argmax(1) != P_sk.argmax(1)) & clear))
    if diff > atol or disagree:
        raise TrainingError(
            f"onnx: expected the exported model to match scikit-learn within {atol}, received max |dP| = {diff:.3g} "
            f"and {disagree} differing decisions; not promoted"
        )
    return {"onnx_max_abs_diff": diff, "onnx_checked": float(len(X))}


def model_meta(
    fitted: FittedRecogniser,
    *,
    bundle_id: str,
    kinds: Sequence[str],
    n_components: int,
    n_templates: int,
    key_id: str = "",
) -> dict[str, Any]:
    """What ``model.json`` records next to the ONNX file (``key_id``: the site key's public id, "" for none)."""
    return {
        "format": "peep-model/1",
        "classes": fitted.class_names,
        "background_index": fitted.background_index,
        "unknown_threshold": fitted.unknown_threshold,
        "unknown_threshold_fused": fitted.unknown_threshold_fused,
        "class_priors": None if fitted.class_priors is None else [float(v) for v in fitted.class_priors],
        "verify_threshold": fitted.verify_threshold,
        "target_far": fitted.target_far,
        "unknown_reject_rate": fitted.unknown_reject_rate,
        "bundle_id": bundle_id,
        "key_id": key_id,
        "mechanism_kinds": list(kinds),
        "n_components": n_components,
        "n_templates": n_templates,
        "n_subjects": len(fitted.class_names) - (1 if fitted.background_index is not None else 0),
        "preset": fitted.preset.describe(),
        "metrics": fitted.metrics,
        "trained_at": time.time(),
        # Keys the opaque class ids of the device models made from this version (peep.core.devicemodel):
        # the server maps a device's released label back to a subject with it; devices never see names.
        "device_class_salt": os.urandom(16).hex(),
    }
