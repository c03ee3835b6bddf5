"""The query module: the only read path to the soft-trait store.

:class:`QbbsModule` owns the private store, the fixed query plan, the Laplace
mechanisms and the privacy odometer. Its public operations never return a
stored value: enrolment writes, :meth:`~QbbsModule.query` returns the
synthesised noisy value Y' = f(R') (spending ε), :meth:`~QbbsModule.verify`
returns the fused score of a claim (spending ε for the traits it uses), and
:meth:`~QbbsModule.odometer` reports the spend.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from peep.core.accounting import SpendLedger
from peep.core.mechanisms import LaplaceMechanism
from peep.core.sampling import check_random_state
from peep.core.wire import SUBJECT_PATTERN
from peep.server.qbbs._store import _SoftTraitStore
from peep.server.qbbs.config import FACE, QbbsConfig, TraitSpec, load_config
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
from peep.server.qbbs.odometer import OdometerReading, PrivacyOdometer
from peep.server.qbbs.queries import QueryPlan, SumQuery, sensitivity, structure_fingerprint

__all__ = ["QbbsModule", "QueryResult", "TraitScore", "VerifyResult"]


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
    trait: str
    log_likelihood: float
    weight: float
    width: float


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    """Fused verification of a claim (chapter Eq. 5.7)."""

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
    """

    def __init__(
        self,
        config: QbbsConfig,
        *,
        random_state: object = None,
        face_scores: FaceScoreProvider | None = None,
        ledger: SpendLedger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(config, QbbsConfig):
            raise TypeError(f"config: expected a QbbsConfig, received {type(config).__name__}")
        self.config = config
        self._sampler = check_random_state(random_state)
        self.plan = QueryPlan.from_config(config)
        self._soft_trait_store = _SoftTraitStore(config.store_path)
        fingerprint, description = structure_fingerprint(config)
        self._soft_trait_store.bind_structure(fingerprint, description)
        self.structure = description
        self.odometer_ = PrivacyOdometer(
            cap=config.epsilon_cap,
            ledger_path=None if ledger is not None else config.ledger_path,
            ledger=ledger,
            clock=clock,
        )
        self._lock = threading.RLock()
        self._mechanisms: dict[tuple[str, float], LaplaceMechanism] = {}
        self._face = face_scores
        self._parzen: ParzenScoreModel | None = None
        self._parzen_version: object = None

    @classmethod
    def from_config_file(cls, path: str | os.PathLike[str], **kwargs: Any) -> QbbsModule:
        return cls(load_config(path), **kwargs)

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
        if not isinstance(subject, str) or not SUBJECT_PATTERN.match(subject):
            raise QbbsError(
                f"{name}: expected 1-128 characters without control characters, '/', '+' or '#', received {subject!r}"
            )
        return subject

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
            self.odometer_.check(subject, cost)
            out: dict[str, _Noisy] = {}
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
            self.odometer_.spend(
                subject,
                cost,
                operation=operation,
                traits=list(traits),
                responses=len(traits) * self.plan.m,
                requester=requester,
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
            return self._parzen

    def use_face_model(self, model: ParzenScoreModel) -> None:
        """Use an already fitted Parzen model (e.g. from an evaluation)."""
        with self._lock:
            self._parzen = model
            self._parzen_version = getattr(self._face, "model_version", None)

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

    def default_threshold(self, weights: Mapping[str, float]) -> float:
        """Fused score of a claim with face posterior 0.5 and each trait 2 (effective) widths off."""
        g = weights[FACE] * math.log(0.5)
        for t, w in weights.items():
            if t != FACE:
                g += w * float(gaussian_log_likelihood(2.0 * self.effective_width(t), 0.0, self.effective_width(t)))
        return g

    def _weights(self, traits: Sequence[str]) -> dict[str, float]:
        used = {FACE: self.config.weights[FACE], **{t: self.config.weights[t] for t in traits}}
        total = math.fsum(used.values())
        if not total > 0:
            raise QbbsError(f"weights: the face and the observed traits {list(traits)} all have weight 0")
        return check_weights({k: v / total for k, v in used.items()})

    def verify(
        self,
        *,
        claimed_subject: str,
        face_score: float,
        observed: Mapping[str, Any],
        observed_variance: Mapping[str, float] | None = None,
        requester: str = "",
    ) -> VerifyResult:
        """Fused verification of a claim from a face score and observed traits.

        For each observed trait the plan's queries give Y'; with
        ``shared-noise`` the observed value is transformed Y*' = Y* + φ (the
        chapter), with ``independent`` it is compared as is against Y' with
        the noise-aware width. Weights are renormalised over the face and
        the traits actually observed. ``observed_variance`` adds known noise
        of an observation (e.g. the edge's local-DP release) to its width.

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
        extra = dict(observed_variance or {})
        for t, v in extra.items():
            if t not in values or not (math.isfinite(v) and v >= 0):
                raise QbbsError(
                    f"observed_variance.{t}: expected a finite variance >= 0 of an observed trait, received {v!r}"
                )
        traits = [t for t in self.config.traits if t in values]
        parzen = self.face_model()
        log_p = float(parzen.log_posterior([float(face_score)])[0])
        weights = self._weights(traits)
        noisy = self._synthesise(subject, traits, operation="verify", requester=requester) if traits else {}
        scores: list[TraitScore] = []
        lls: dict[str, float] = {}
        for t in traits:
            n = noisy[t]
            spec = self.config.traits[t]
            obs_var = extra.get(t, 0.0)
            if self.config.verification_transform == "shared-noise":
                width = math.sqrt(spec.width**2 + obs_var)
                ll = float(gaussian_log_likelihood(values[t] + n.phi, n.value, width))
            else:
                width = math.sqrt(spec.width**2 + n.variance + obs_var)
                ll = float(gaussian_log_likelihood(values[t], n.value, width))
            lls[t] = ll
            scores.append(TraitScore(trait=t, log_likelihood=ll, weight=weights[t], width=width))
        g = fused_score(log_p, lls, weights)
        threshold = self.config.threshold if self.config.threshold is not None else self.default_threshold(weights)
        spent = len(traits) * self.config.epsilon_per_value
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
        )

    def verify_template(
        self,
        *,
        claimed_subject: str,
        values: ArrayLike,
        observed: Mapping[str, Any],
        observed_variance: Mapping[str, float] | None = None,
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
            requester=requester,
        )

    # -- odometer --------------------------------------------------------------------------

    def odometer(self, subject: str) -> OdometerReading:
        return self.odometer_.reading(self._subject(subject))

    def audit_log(self, subject: str | None = None) -> list[dict[str, Any]]:
        return self.odometer_.audit_log(None if subject is None else self._subject(subject))
