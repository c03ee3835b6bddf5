"""SGAP training parameters: one frozen, keyword-only dataclass, validated at construction.

No torch here: the CLI validates its options with this before anything heavy loads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

#: The population ``peep anonymize evaluate`` is run on is LFW's people with >= 20 images; the
#: background a generator trains on must stay below it, so no evaluated person is ever seen.
EVALUATED_MIN_FACES = 20


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, received {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name}: expected an int {bound}, received {value}")


def _check_float(name: str, value: object, low: float, high: float, *, open_low: bool, open_high: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: expected a number, received {type(value).__name__} {value!r}")
    v = float(value)
    bad = not math.isfinite(v) or (v <= low if open_low else v < low) or (v >= high if open_high else v > high)
    if bad:
        lo, hi = "(" if open_low else "[", ")" if open_high else "]"
        raise ValueError(f"{name}: expected a number in {lo}{low}, {high}{hi}, received {value!r}")


@dataclass(frozen=True, kw_only=True)
class SgapConfig:
    """How one SGAP generator is trained.

    Parameters
    ----------
    lam : float in (0, 1)
        The distortion constraint λ: every privatized face must keep
        SSIM(original, privatized) >= 1 − λ.
    epochs : int
        Passes over the training faces (each face is the anchor of one pair per epoch).
    batch_size : int
        Pairs per step (at least 2: batch norm needs more than one sample).
    lr_generator, lr_discriminator : float
        Adam learning rates (β₁ = ``beta1``, β₂ = ``beta2``; the paper's 0.9, 0.999).
    penalty : float
        Weight of the SSIM constraint's hinge penalty,
        ``penalty · mean(max(0, 1 − λ + slack − SSIM))`` per face.
    slack : float
        How far above the floor 1 − λ the penalty aims, so that faces the
        training batches did not see (and batch norm's running statistics at
        inference) still clear it.
    discriminator_steps : int
        Discriminator updates per generator update.
    pretrain_epochs : int
        Epochs the discriminator first learns face verification on real pairs
        (each face mirrored at random), before the generator plays against
        it. Without them the game starts against a discriminator at chance,
        and "fooled" means little: the paper's fooling rate is only a privacy
        figure against a discriminator that can tell people apart.
    width : int
        The generator's first encoder width (see :class:`~peep.lab.sgap.model.Generator`).
    val_fraction : float in (0, 0.5]
        Share of the background people (whole identities) held out to measure
        the discriminator and SSIM on faces training never saw.
    seed : int
        Seeds torch and the pair sampler; the same seed and data reproduce the
        same generator on the same machine.
    """

    lam: float
    epochs: int = 20
    batch_size: int = 64
    lr_generator: float = 2e-4
    lr_discriminator: float = 2e-4
    beta1: float = 0.9
    beta2: float = 0.999
    penalty: float = 100.0
    slack: float = 0.01
    discriminator_steps: int = 1
    pretrain_epochs: int = 5
    width: int = 16
    val_fraction: float = 0.15
    seed: int = 0

    def __post_init__(self) -> None:
        _check_float("lambda", self.lam, 0.0, 1.0, open_low=True, open_high=True)
        _check_int("epochs", self.epochs, 1)
        _check_int("batch_size", self.batch_size, 2)
        _check_float("lr_generator", self.lr_generator, 0.0, 1.0, open_low=True, open_high=False)
        _check_float("lr_discriminator", self.lr_discriminator, 0.0, 1.0, open_low=True, open_high=False)
        _check_float("beta1", self.beta1, 0.0, 1.0, open_low=False, open_high=True)
        _check_float("beta2", self.beta2, 0.0, 1.0, open_low=False, open_high=True)
        _check_float("penalty", self.penalty, 0.0, 1e6, open_low=True, open_high=False)
        _check_float("slack", self.slack, 0.0, 0.5, open_low=False, open_high=False)
        if self.slack >= self.lam:
            raise ValueError(f"slack: expected < lambda ({self.lam}), received {self.slack}")
        _check_int("discriminator_steps", self.discriminator_steps, 1, 20)
        _check_int("pretrain_epochs", self.pretrain_epochs, 0, 1000)
        _check_int("width", self.width, 2, 256)
        _check_float("val_fraction", self.val_fraction, 0.0, 0.5, open_low=True, open_high=False)
        _check_int("seed", self.seed, 0)

    @property
    def ssim_floor(self) -> float:
        """1 − λ: the least SSIM a privatized face keeps."""
        return 1.0 - float(self.lam)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lambda"] = d.pop("lam")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SgapConfig:
        d = dict(d)
        d["lam"] = d.pop("lambda")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"SGAP configuration: unknown fields {unknown}")
        return cls(**d)


def check_background(*, min_faces: int, max_faces: int | None) -> None:
    """Refuse a training population that could hold people the evaluation uses.

    The anonymisation evaluation uses LFW's people with at least :data:`EVALUATED_MIN_FACES`
    images; a generator trained on any of them would have seen the faces it is
    judged on. ``max_faces`` (a file count, so an upper bound on usable faces)
    must therefore be set and below that.
    """
    _check_int("min_faces", min_faces, 2)
    if max_faces is None:
        raise ValueError(
            f"max_faces: expected <= {EVALUATED_MIN_FACES - 1} (the background population, disjoint from the "
            f"evaluated people with >= {EVALUATED_MIN_FACES} images), received None"
        )
    _check_int("max_faces", max_faces, min_faces)
    if max_faces >= EVALUATED_MIN_FACES:
        raise ValueError(
            f"max_faces: expected <= {EVALUATED_MIN_FACES - 1} (the evaluated people have >= "
            f"{EVALUATED_MIN_FACES} images and must never be trained on), received {max_faces}"
        )
