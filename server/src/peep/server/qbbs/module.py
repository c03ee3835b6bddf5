"""The query module: the only read path to the soft-trait store.

:class:`QbbsModule` owns the private store, the fixed query plan, the Laplace
mechanisms and the privacy odometer. Its public operations never return a
stored value: enrolment writes, :meth:`~QbbsModule.query` returns the
synthesised noisy value Y' = f(R') (spending ε), :meth:`~QbbsModule.verify`
returns the fused score of a claim (spending ε for the traits it uses), and
:meth:`~QbbsModule.odometer` reports the spend.

A verification uses (queries, and charges the subject for) only the observed
traits whose weight for the claim is positive. A trait of weight 0 -- the
configuration's, or the calibration's choice, e.g. at small ε where the
noisy answers are worth less than the face score -- cannot move the fused
score, so answering it would spend ε for nothing. Which traits are used
depends only on the weights, which come from public information, so the
choice itself reveals nothing about the stored values.

The fused decision is calibrated (:mod:`peep.server.qbbs.calibration`) for
``config.target_far`` unless ``config.threshold`` fixes it: per claim shape
(the traits a claim observes and their known observation noise), from the
Parzen model's validation scores and public information only, redone when
the Parzen densities are refitted, simulating people from the deployer's
declared public population (``config.population``). The calibration is handed
no store.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from peep.core.accounting import SpendLedger
from peep.core.exceptions import WireError
from peep.core.mechanisms import LaplaceMechanism
from peep.core.sampling import check_random_state
from peep.core.wire import check_subject_id
from peep.server.config.qbbs import FACE, QbbsConfig, TraitSpec, load_qbbs_config
from peep.server.qbbs._store import PostgresSoftTraitStore, SoftTraitStore
from peep.server.qbbs.calibration import Calibration, ObservationNoise, TraitTerm, calibrate
from peep.server.qbbs.errors import (
    FaceScoreUnavailableError,
    QbbsError,
    QueryShapeError,
    TraitValueError,
    UnknownSubjectError,
    UnknownTraitError,
)
from peep.server.qbbs.face import FaceScoreProvider
from peep.server.qbbs.matcher import ParzenScoreModel, check_weights, fused_score, gaussian_log_likelihood
from peep.server.qbbs.odometer import DatabaseOdometer, OdometerReading, PrivacyOdometer
from peep.server.qbbs.queries import QueryPlan, SumQuery, sensitivity, structure_fingerprint

__all__ = ["QbbsModule", "QueryResult", "TraitScore", "VerifyResult"]

log = logging.getLogger(__name__)

#: Claim shapes whose calibration is kept (least recently used dropped first).
MAX_CALIBRATIONS = 32


@dataclass(frozen=True, kw_only=True)
class QueryResult:
    """One synthesised noisy trait value.

    Attributes
    ----------
    value : float
        Y' = f(R'), the stored value plus net noise φ.
    noise_std : float
        Standard deviation of φ (public: depends only on the configuration).
    sensitivity : float
        Δf of each SUM response.
    responses : int
        SUM queries answered (m).
    epsilon_spent, epsilon_total : float
        This answer's ε and the subject's cumulative ε after it.
    """

    subject: str
    trait: str
    value: float
    noise_std: float
    sensitivity: float
    responses: int
    epsilon_spent: float
    epsilon_total: float


@dataclass(frozen=True, kw_only=True)
class TraitScore:
    """One used trait's term: log P(Y*'|Y'), its weight (> 0) and the likelihood width."""

    trait: str
    log_likelihood: float
    weight: float
    width: float


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """Fused verification of a claim (chapter Eq. 5.7).

    ``accepted`` is ``fused_score >= threshold``; ``calibration`` is the
    calibrated decision used (``None`` with a fixed ``config.threshold``).
    ``traits`` holds the observed traits that were used: queried, charged and
    summed into ``fused_score`` (each with weight > 0); ``skipped`` names the
    observed traits of weight 0, which were neither queried nor charged.
    ``epsilon_spent`` is what this verification released: ``len(traits)``
    trait values.
    """

    claimed_subject: str
    accepted: bool
    fused_score: float
    threshold: float
    face_score: float
    log_p_genuine_face: float
    face_weight: float
    traits: tuple[TraitScore, ...]
    epsilon_spent: float
    epsilon_total: float
    calibration: Calibration | None = None
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Noisy:
    value: float  # Y'
    phi: float  # Y' - Y (never leaves the module)
    variance: float  # Var φ
    sensitivity: float


class QbbsModule:
    """Soft-trait store + permissible queries + odometer + fusion.

    Parameters
    ----------
    config : QbbsConfig
    random_state : None or seed
        ``None`` (default) draws noise from the secure sampler; an int seed is
        for evaluation simulations and needs the ``"seeded-noise"`` feature.
    face_scores : FaceScoreProvider, optional
        Needed by :meth:`verify_template` (and by :meth:`verify` for the
        Parzen densities).
    ledger : SpendLedger, optional
        Overrides ``config.ledger_path`` (e.g. the server's database ledger).
    clock : callable
    connect : callable returning a psycopg connection, optional
        Keep the soft traits and the odometer in PostgreSQL instead of ``store_path`` and
        ``ledger_path`` (replicas sharing one database: one cap per subject across them).
    """

    def __init__(
        self,
        config: QbbsConfig,
        *,
        random_state: object = None,
        face_scores: FaceScoreProvider | None = None,
        ledger: SpendLedger | None = None,
        clock: Callable[[], float] = time.time,
        connect: Callable[[], Any] | None = None,
    ) -> None:
        if not isinstance(config, QbbsConfig):
            raise TypeError(f"config: expected a QbbsConfig, received {type(config).__name__}")
        self.config = config
        self._sampler = check_random_state(random_state)
        self.plan = QueryPlan.from_config(config)
        self._soft_trait_store: SoftTraitStore | PostgresSoftTraitStore
        self.odometer_: PrivacyOdometer | DatabaseOdometer
        if connect is not None:
            self._soft_trait_store = PostgresSoftTraitStore(connect)
            self.odometer_ = DatabaseOdometer(cap=config.epsilon_cap, connect=connect, clock=clock)
        else:
            self._soft_trait_store = SoftTraitStore(config.store_path)
            self.odometer_ = PrivacyOdometer(
                cap=config.epsilon_cap,
                ledger_path=None if ledger is not None else config.ledger_path,
                ledger=ledger,
                clock=clock,
            )
        fingerprint, description = structure_fingerprint(config)
        self._soft_trait_store.bind_structure(fingerprint, description)
        self.structure = description
        self._lock = threading.RLock()
        self._mechanisms: dict[tuple[str, float], LaplaceMechanism] = {}
        self._face = face_scores
        self._parzen: ParzenScoreModel | None = None
        self._parzen_version: object = None
        # Bumped whenever the Parzen model changes: calibrations of an older one are stale.
        self._face_generation = 0
        self._calibration_lock = threading.Lock()
        self._calibrations: OrderedDict[tuple[Any, ...], tuple[int, Calibration]] = OrderedDict()
        #: The most recent calibration (``None`` before the first, or with a fixed threshold).
        self.calibration_: Calibration | None = None

    @classmethod
    def from_config_file(cls, path: str | os.PathLike[str], **kwargs: Any) -> QbbsModule:
        return cls(load_qbbs_config(path), **kwargs)

    def close(self) -> None:
        self._soft_trait_store.close()
        self.odometer_.close()

    def __enter__(self) -> QbbsModule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_secure(self) -> bool:
        """Whether noise comes from the secure sampler."""
        return bool(self._sampler.is_secure)

    # -- validation ------------------------------------------------------------------

    def _spec(self, trait: Any) -> TraitSpec:
        if not isinstance(trait, str) or trait not in self.config.traits:
            raise UnknownTraitError(
                f"trait: expected one of {sorted(self.config.traits)} (this deployment's traits), received {trait!r}"
            )
        return self.config.traits[trait]

    def _value(self, trait: str, value: Any, *, enrol: bool) -> float:
        spec = self._spec(trait)
        what = "enrolled" if enrol else "observed"
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TraitValueError(f"{trait}: expected a number ({spec.unit}), received {value!r}")
        v = float(value)
        if not math.isfinite(v):
            raise TraitValueError(f"{trait}: expected a finite number ({spec.unit}), received {v}")
        if not spec.lower <= v <= spec.upper:
            raise TraitValueError(
                f"{trait}: expected an {what} value in the declared range [{spec.lower:g}, {spec.upper:g}] "
                f"{spec.unit}, received {v:g}"
            )
        if enrol and spec.kind == "binary" and v not in (0.0, 1.0):
            raise TraitValueError(f"{trait}: expected 0 or 1 ({spec.unit}), received {v:g}")
        return v

    @staticmethod
    def _subject(subject: Any, name: str = "subject") -> str:
        try:
            return check_subject_id(subject, name)
        except WireError as exc:
            raise QbbsError(str(exc)) from None

    # -- enrolment -------------------------------------------------------------------

    def enrol(self, subject: str, traits: Mapping[str, Any]) -> int:
        """Store (or replace) ``subject``'s soft traits; returns how many were stored.

        All values are validated before anything is written.
        """
        subject = self._subject(subject)
        if not traits:
            raise QbbsError("traits: expected at least one trait value, received none")
        clean = {t: self._value(t, v, enrol=True) for t, v in traits.items()}
        self._soft_trait_store.upsert(subject, clean)
        return len(clean)

    def erase(self, subject: str) -> int:
        """Delete every stored trait of ``subject`` (the spend ledger is kept: it is the audit log)."""
        return self._soft_trait_store.delete(self._subject(subject))

    def enrolled_traits(self, subject: str) -> list[str]:
        """Which traits ``subject`` has (names only; values are never returned)."""
        return self._soft_trait_store.traits_of(self._subject(subject))

    def n_subjects(self) -> int:
        return self._soft_trait_store.n_subjects()

    # -- the permissible queries --------------------------------------------------------

    def _mechanism(self, trait: str, delta_f: float) -> LaplaceMechanism:
        key = (trait, delta_f)
        mech = self._mechanisms.get(key)
        if mech is None:
            mech = LaplaceMechanism(epsilon=self.config.epsilon, sensitivity=delta_f, random_state=self._sampler)
            if self.config.sensitivity == "declared-range":
                self._mechanisms[key] = mech
        return mech

    def _synthesise(self, subject: str, traits: Sequence[str], *, operation: str, requester: str) -> dict[str, _Noisy]:
        """Answer the plan's queries for each trait, spending ε; the only reader of the store."""
        with self._lock:
            columns = {}
            for t in traits:
                subjects, values = self._soft_trait_store.column(t)
                try:
                    i = subjects.index(subject)
                except ValueError:
                    raise UnknownSubjectError(f"subject: {subject!r} has no enrolled {t!r}") from None
                columns[t] = (subjects, values, i)
            cost = len(traits) * self.config.epsilon_per_value
            out: dict[str, _Noisy] = {}
            # The spend and the release are one step: checked (under the subject's row lock on
            # PostgreSQL), computed, recorded; a refusal or an error records and releases nothing.
            with self.odometer_.charge(
                subject,
                cost,
                operation=operation,
                traits=list(traits),
                responses=len(traits) * self.plan.m,
                requester=requester,
            ):
                for t in traits:
                    subjects, values, i = columns[t]
                    exact = self.plan.exact_responses(t, subject, subjects, values)
                    delta_f = sensitivity(self.config.traits[t], values, self.config.sensitivity)
                    mech = self._mechanism(t, delta_f)
                    noisy = np.asarray(mech.randomise(exact), dtype=np.float64)
                    y_noisy = self.plan.synthesise(noisy)
                    out[t] = _Noisy(
                        value=y_noisy,
                        phi=y_noisy - float(values[i]),
                        variance=self.plan.net_noise_variance(mech.variance),
                        sensitivity=delta_f,
                    )
            return out

    def query(self, subject: str, trait: str, *, requester: str = "") -> QueryResult:
        """Admin query: the synthesised noisy value Y' of ``subject``'s ``trait``.

        Answers the plan's m SUM queries with Laplace(Δf/ε) noise each and
        returns only f(R'). Costs the subject ``pairs·ε``.

        Raises
        ------
        UnknownTraitError, UnknownSubjectError, OdometerExhaustedError
        """
        subject = self._subject(subject)
        self._spec(trait)
        noisy = self._synthesise(subject, [trait], operation="query", requester=requester)[trait]
        return QueryResult(
            subject=subject,
            trait=trait,
            value=noisy.value,
            noise_std=math.sqrt(noisy.variance),
            sensitivity=noisy.sensitivity,
            responses=self.plan.m,
            epsilon_spent=self.config.epsilon_per_value,
            epsilon_total=self.odometer_.spent(subject),
        )

    def execute(self, queries: Sequence[SumQuery], *, requester: str = "") -> QueryResult:
        """Answer an explicitly stated query set, if and only if it is the fixed plan.

        Anything else -- another aggregate, another subject set, a subset of
        the plan, a single raw SUM -- raises :class:`QueryShapeError`.
        """
        qs = list(queries)
        if not qs or not all(isinstance(q, SumQuery) for q in qs):
            raise QueryShapeError(f"queries: expected the plan's {self.plan.m} SumQuery objects, received {qs!r}")
        trait = qs[0].trait
        subject = next((q.exclude for q in qs if q.exclude is not None), None)
        if subject is None:
            raise QueryShapeError(
                "queries: expected pairs of SUM(set) and SUM(set minus the claimed subject); "
                "no query excludes a subject"
            )
        self._spec(trait)
        self.plan.check(qs, trait, subject)
        return self.query(subject, trait, requester=requester)

    # -- fused verification ---------------------------------------------------------------

    def set_face_scores(self, provider: FaceScoreProvider | None) -> None:
        with self._lock:
            self._face = provider
            self._parzen = None
            self._face_generation += 1

    def face_model(self) -> ParzenScoreModel:
        """The Parzen model of P(genuine | face score), (re)fitted from the provider's validation scores."""
        with self._lock:
            if self._face is None:
                if self._parzen is not None:
                    return self._parzen
                raise FaceScoreUnavailableError(
                    "fused verification needs a face-score provider (the server's recogniser); none is configured"
                )
            version = getattr(self._face, "model_version", None)
            if self._parzen is None or version != self._parzen_version:
                genuine, impostor = self._face.validation_scores()
                try:
                    parzen = ParzenScoreModel(prior=self.config.genuine_prior).fit(genuine, impostor)
                except ValueError as exc:
                    # Too few (or non-finite) validation scores is the recogniser's
                    # state, not the caller's input: a precondition, not a bad argument.
                    raise FaceScoreUnavailableError(
                        f"P(genuine | face score) cannot be fitted on the face recogniser's validation scores "
                        f"(model {version or '?'}): {exc}"
                    ) from exc
                self._parzen = parzen
                self._parzen_version = version
                self._face_generation += 1
            return self._parzen

    def use_face_model(self, model: ParzenScoreModel) -> None:
        """Use an already fitted Parzen model (e.g. from an evaluation)."""
        with self._lock:
            self._parzen = model
            self._parzen_version = getattr(self._face, "model_version", None)
            self._face_generation += 1

    def _face_state(self) -> tuple[ParzenScoreModel, int, object]:
        """The Parzen model (refitted if due), its generation and its face-model version, consistently."""
        with self._lock:
            parzen = self.face_model()
            return parzen, self._face_generation, self._parzen_version

    def effective_width(self, trait: str) -> float:
        """The likelihood width used for ``trait``: c, or sqrt(c² + Var φ) for ``independent``."""
        spec = self._spec(trait)
        if self.config.verification_transform == "shared-noise":
            return spec.width
        var = self.plan.net_noise_variance(self._response_variance(trait))
        return math.sqrt(spec.width**2 + var)

    def _response_variance(self, trait: str) -> float:
        spec = self._spec(trait)
        if self.config.sensitivity == "declared-range":
            return self._mechanism(trait, spec.range).variance
        # Data-dependent Δf: the width cannot be known without reading the store.
        _, values = self._soft_trait_store.column(trait)
        return self._mechanism(trait, sensitivity(spec, values, self.config.sensitivity)).variance

    def _weights(self, traits: Sequence[str]) -> dict[str, float]:
        """The configured (or fallback) weights renormalised over the face and ``traits``."""
        fixed = self.config.fixed_weights()
        used = {FACE: fixed[FACE], **{t: fixed[t] for t in traits}}
        total = math.fsum(used.values())
        if not total > 0:
            raise QbbsError(f"weights: the face and the observed traits {list(traits)} all have weight 0")
        return check_weights({k: v / total for k, v in used.items()})

    # -- calibration of the fused decision -------------------------------------------------

    def _observation_noise(
        self,
        traits: Sequence[str],
        observed_variance: Mapping[str, float] | None,
        observed_noise: Mapping[str, ObservationNoise] | None,
    ) -> dict[str, ObservationNoise]:
        """Validated known noise of each observed trait (a bare variance is Gaussian)."""
        out: dict[str, ObservationNoise] = {}
        for t, v in (observed_variance or {}).items():
            if (
                t not in traits
                or isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not (math.isfinite(v) and v >= 0)
            ):
                raise QbbsError(
                    f"observed_variance.{t}: expected a finite variance >= 0 of an observed trait, received {v!r}"
                )
            out[t] = ObservationNoise.gaussian(v)
        for t, n in (observed_noise or {}).items():
            if t not in traits or not isinstance(n, ObservationNoise):
                raise QbbsError(
                    f"observed_noise.{t}: expected the ObservationNoise of an observed trait, received {n!r}"
                )
            if t in out:
                raise QbbsError(f"observed_noise.{t}: expected the noise once, received it with observed_variance too")
            out[t] = n
        return out

    def _trait_terms(self, traits: Sequence[str], noise: Mapping[str, ObservationNoise]) -> list[TraitTerm]:
        """The public description of each observed trait's term, with the widths :meth:`verify` uses."""
        terms = []
        for t in traits:
            spec = self._spec(t)
            mech = self._mechanism(t, spec.range)  # declared range: the config refuses calibration otherwise
            obs_var = noise[t].variance if t in noise else 0.0
            shared = self.config.verification_transform == "shared-noise"
            phi_var = 0.0 if shared else self.plan.net_noise_variance(mech.variance)
            terms.append(
                TraitTerm(
                    name=t,
                    spec=spec,
                    width=math.sqrt(spec.width**2 + phi_var + obs_var),
                    response_scale=mech.scale,
                    pairs=self.plan.pairs,
                    shared_noise=shared,
                    noise=noise.get(t),
                )
            )
        return terms

    def _calibrated(self, traits: Sequence[str], noise: Mapping[str, ObservationNoise]) -> Calibration:
        """The calibration for claims observing ``traits`` with ``noise`` (cached per Parzen model)."""
        if self.config.weights is not None:
            self._weights(traits)  # refuse all-zero weights before simulating
        key = tuple((t, noise.get(t)) for t in traits)
        with self._calibration_lock:
            parzen, generation, version = self._face_state()
            cached = self._calibrations.get(key)
            if cached is not None and cached[0] == generation:
                self._calibrations.move_to_end(key)
                return cached[1]
            t0 = time.perf_counter()
            cal = calibrate(
                parzen=parzen,
                terms=self._trait_terms(traits, noise),
                target_far=self.config.target_far,
                claims=self.config.calibration_claims,
                weights=None if self.config.weights is None else self._weights(traits),
                model_version=version,
                population=self.config.population,
            )
            self._calibrations[key] = (generation, cal)
            self._calibrations.move_to_end(key)
            while len(self._calibrations) > MAX_CALIBRATIONS:
                self._calibrations.popitem(last=False)
            self.calibration_ = cal
        log.info(
            "QBBS: fused threshold calibrated (target FAR %.4g: simulated FAR %.4g, GAR %.4g, threshold %.6g)",
            cal.target_far,
            cal.simulated_far,
            cal.simulated_gar,
            cal.threshold,
            extra={"calibration": cal.describe(), "seconds": round(time.perf_counter() - t0, 3)},
        )
        return cal

    def calibration(
        self, observed: Sequence[str] | None = None, observed_noise: Mapping[str, ObservationNoise] | None = None
    ) -> Calibration:
        """The calibrated decision for claims observing ``observed`` (default: every trait) with that noise.

        Computed on first use per claim shape and Parzen model (refitted when
        the face model's version changes), from public information only.

        Raises
        ------
        QbbsError
            ``config.threshold`` is fixed (nothing is calibrated), or bad arguments.
        FaceScoreUnavailableError
            No Parzen model can be fitted.
        """
        if self.config.threshold is not None:
            raise QbbsError(
                f"threshold: fixed at {self.config.threshold:g} by the configuration; nothing is calibrated"
            )
        names = list(self.config.traits) if observed is None else list(observed)
        for t in names:
            self._spec(t)
        traits = [t for t in self.config.traits if t in names]
        return self._calibrated(traits, self._observation_noise(traits, None, observed_noise))

    def recalibrate(self) -> list[Calibration]:
        """Recalibrate every claim shape seen so far (or the all-traits one) for the current Parzen model.

        The hosting server calls this when a model is promoted, so the first
        verification after it does not pay for the simulation. Returns ``[]``
        with a fixed threshold.
        """
        if self.config.threshold is not None:
            return []
        with self._calibration_lock:
            shapes = list(self._calibrations) or [tuple((t, None) for t in self.config.traits)]
        out = []
        for key in reversed(shapes):  # most recently used first
            traits = [t for t, _ in key]
            out.append(self._calibrated(traits, {t: n for t, n in key if n is not None}))
        return out

    @property
    def calibrations_(self) -> list[Calibration]:
        """Current calibrations (for the Parzen model in use), most recently used last."""
        with self._calibration_lock:
            gen = self._face_generation
            return [cal for g, cal in self._calibrations.values() if g == gen]

    def verify(
        self,
        *,
        claimed_subject: str,
        face_score: float,
        observed: Mapping[str, Any],
        observed_variance: Mapping[str, float] | None = None,
        observed_noise: Mapping[str, ObservationNoise] | None = None,
        requester: str = "",
    ) -> VerifyResult:
        """Fused verification of a claim from a face score and observed traits.

        For each observed trait the plan's queries give Y'; with
        ``shared-noise`` the observed value is transformed Y*' = Y* + φ (the
        chapter), with ``independent`` it is compared as is against Y' with
        the noise-aware width. ``observed_noise`` (or, as a Gaussian,
        ``observed_variance``) describes known noise of an observation (e.g.
        the edge's local-DP release): its variance widens the likelihood and
        the calibration simulates it. Accept iff the fused score is at least
        the threshold: ``config.threshold`` if fixed, else the calibrated one
        for this claim shape (whose weights are used too, unless
        ``config.weights`` fixes them); fixed weights are renormalised over
        the face and the traits actually observed. Observed traits whose
        weight is 0 are not queried and cost nothing (see
        :attr:`VerifyResult.skipped`).

        Raises
        ------
        UnknownTraitError, TraitValueError, UnknownSubjectError, OdometerExhaustedError,
        FaceScoreUnavailableError
        """
        subject = self._subject(claimed_subject, "claimed_subject")
        if (
            isinstance(face_score, bool)
            or not isinstance(face_score, (int, float, np.floating))
            or not math.isfinite(float(face_score))
        ):
            raise QbbsError(f"face_score: expected a finite number, received {face_score!r}")
        values = {t: self._value(t, v, enrol=False) for t, v in observed.items()}
        traits = [t for t in self.config.traits if t in values]
        noise = self._observation_noise(traits, observed_variance, observed_noise)
        calibration: Calibration | None = None
        if self.config.threshold is None:
            # Before spending: a claim that cannot be decided must not cost ε.
            calibration = self._calibrated(traits, noise)
            weights, threshold = dict(calibration.weights), calibration.threshold
        else:
            weights, threshold = self._weights(traits), self.config.threshold
        parzen = self.face_model()
        log_p = float(parzen.log_posterior([float(face_score)])[0])
        # Weight 0 adds nothing to g: querying it would spend ε (and reveal Y') for no decision.
        used = [t for t in traits if weights[t] > 0.0]
        skipped = tuple(t for t in traits if t not in used)
        noisy = self._synthesise(subject, used, operation="verify", requester=requester) if used else {}
        scores: list[TraitScore] = []
        lls: dict[str, float] = {}
        for t in used:
            n = noisy[t]
            spec = self.config.traits[t]
            obs_var = noise[t].variance if t in noise else 0.0
            if self.config.verification_transform == "shared-noise":
                width = math.sqrt(spec.width**2 + obs_var)
                ll = float(gaussian_log_likelihood(values[t] + n.phi, n.value, width))
            else:
                width = math.sqrt(spec.width**2 + n.variance + obs_var)
                ll = float(gaussian_log_likelihood(values[t], n.value, width))
            lls[t] = ll
            scores.append(TraitScore(trait=t, log_likelihood=ll, weight=weights[t], width=width))
        g = fused_score(log_p, lls, weights)
        spent = len(used) * self.config.epsilon_per_value
        return VerifyResult(
            claimed_subject=subject,
            accepted=bool(g >= threshold),
            fused_score=g,
            threshold=threshold,
            face_score=float(face_score),
            log_p_genuine_face=log_p,
            face_weight=weights[FACE],
            traits=tuple(scores),
            epsilon_spent=spent,
            epsilon_total=self.odometer_.spent(subject),
            calibration=calibration,
            skipped=skipped,
        )

    def verify_template(
        self,
        *,
        claimed_subject: str,
        values: ArrayLike,
        observed: Mapping[str, Any],
        observed_variance: Mapping[str, float] | None = None,
        observed_noise: Mapping[str, ObservationNoise] | None = None,
        template: Any = None,
        requester: str = "",
    ) -> VerifyResult:
        """:meth:`verify` with the face score from the provider for perturbed template ``values``."""
        subject = self._subject(claimed_subject, "claimed_subject")
        if self._face is None:
            self.face_model()  # raises FaceScoreUnavailableError
        assert self._face is not None
        try:
            s = self._face.face_score(subject, np.asarray(values, dtype=np.float32), template=template)
        except KeyError:
            raise UnknownSubjectError(f"claimed_subject: {subject!r} is not known to the face recogniser") from None
        except ValueError as exc:
            raise QbbsError(f"template: the face recogniser cannot score it ({exc})") from exc
        return self.verify(
            claimed_subject=subject,
            face_score=s,
            observed=observed,
            observed_variance=observed_variance,
            observed_noise=observed_noise,
            requester=requester,
        )

    # -- odometer --------------------------------------------------------------------------

    def odometer(self, subject: str) -> OdometerReading:
        return self.odometer_.reading(self._subject(subject))

    def audit_log(self, subject: str | None = None) -> list[dict[str, Any]]:
        return self.odometer_.audit_log(None if subject is None else self._subject(subject))
