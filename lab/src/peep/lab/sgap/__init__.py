"""SGAP, the Siamese generative adversarial privatizer: a learned face anonymiser.

``config``
    :class:`SgapConfig`, the training parameters (no torch).
``runtime``
    :class:`SgapPrivatizer`, a trained generator run from its ONNX file with
    onnxruntime (no torch): what ``peep anonymize`` and a device use.
``model``, ``train``
    The generator, the Siamese discriminator, the differentiable SSIM, the
    training loop and the ONNX export: PyTorch, from the ``sgap`` extra
    (``pip install './lab[sgap]'``). Nothing imports them at start-up.

Importing this package imports neither torch nor onnxruntime.
"""

from __future__ import annotations

from peep.server.errors import UsageError

#: The command that installs what :func:`require_torch` checks for.
SGAP_EXTRA_INSTALL = "pip install './lab[sgap]'"


def require_torch(what: str) -> None:
    """Raise :class:`UsageError` (exit 2) naming the extra when PyTorch is not installed.

    Parameters
    ----------
    what : str
        What needs PyTorch, for the message (e.g. ``"peep sgap train"``).
    """
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise  # torch is there but broken: not a missing extra
        raise UsageError(
            f"{what} trains with PyTorch, which is not installed; install it with {SGAP_EXTRA_INSTALL} "
            "(running a trained model needs only onnxruntime)"
        ) from exc
