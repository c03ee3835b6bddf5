"""Face descriptors on the server: the same encoder a device runs, for building and auditing descriptor bundles.

A projection whose input is a descriptor (``dlib-resnet``) is fitted on the
public faces' descriptors, computed by :func:`peep.edge.embedding.make_encoder`
(the optional extra ``peep-server[dlib]``), so the network a bundle names is
the one that fitted it.
"""

from __future__ import annotations

from typing import Any

from peep.server.errors import UsageError

__all__ = ["descriptor_backend", "descriptor_encoder"]


def descriptor_backend() -> str:
    """The lab's descriptor back end: ``$PEEP_DESCRIPTOR_BACKEND``, else ``"onnxruntime"``."""
    import os

    return os.environ.get("PEEP_DESCRIPTOR_BACKEND") or "onnxruntime"


def descriptor_encoder(kind: str, *, option: str = "--projection", backend: str | None = None) -> Any:
    """The encoder computing descriptors of input ``kind``, or a :class:`UsageError` naming the extra.

    Parameters
    ----------
    kind : str
        A projection's :attr:`~peep.core.projections.base.Projection.input_kind` other than ``"pixels"``.
    option : str
        The command-line option the error names.
    backend : str, optional
        Where the network runs: ``"onnxruntime"`` (dlib's network as a checked ONNX graph, the default) or
        ``"dlib"`` (dlib's own); default ``$PEEP_DESCRIPTOR_BACKEND``, else onnxruntime. Both give the same
        descriptors within 1e-4 per coordinate and name the same network files, so a bundle built with one
        serves devices running the other (the face cache keeps each back end's descriptors apart).
    """
    backend = backend or descriptor_backend()
    if kind != "dlib-resnet":
        raise UsageError(f"{option}: no descriptor encoder is known for projection input {kind!r}")
    try:
        from peep.edge.embedding import make_encoder
    except ImportError as exc:
        raise UsageError(
            f"{option}: input {kind!r} expected the optional extra peep-server[dlib] (it computes the descriptor "
            f"devices compute), received an import error ({exc}); install it with pip install 'peep-server[dlib]'"
        ) from None
    try:
        return make_encoder(backend)
    except ValueError as exc:
        raise UsageError(f"PEEP_DESCRIPTOR_BACKEND: {exc}") from None
    except Exception as exc:  # MissingExtraError: its text names the extra to install
        raise UsageError(f"{option}: {exc}") from None
