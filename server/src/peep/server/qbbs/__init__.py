"""Soft-biometric query module (QBBS): differentially private queries on soft traits,
Bayesian fusion with the face score, and a privacy odometer.

The soft-trait store (``_store``) is private to this package; the query
module (:class:`QbbsModule`) is its only read path, and
``tests/qbbs/test_store_boundary.py`` fails if anything else imports it or
touches its tables. See :mod:`peep.server.qbbs.queries` for the permissible
query structure and its privacy accounting, :mod:`peep.server.qbbs.matcher`
for the fusion, :mod:`peep.server.qbbs.service` for the gRPC service and
:mod:`peep.server.qbbs.calibration` for the fused threshold (calibrated to a
target false-accept rate without reading the store),
:mod:`peep.lab.qbbs.evaluation` for ``peep qbbs evaluate`` (its
experiments in :mod:`peep.lab.qbbs.experiments`, its figures in
:mod:`peep.lab.qbbs.figures`) and
:mod:`peep.server.qbbs.hosting` for :class:`HostedQbbs`, the module as the
recognition server hosts it (built by :class:`peep.server.services.Services`
for ``peep serve`` and ``peep erase`` when ``server.toml`` has a ``[qbbs]``
table). Its configuration model is :mod:`peep.server.config.qbbs`, with the
server's other sections.
"""

from peep.server.config.qbbs import DEFAULT_TRAITS, QbbsConfig, TraitSpec, load_qbbs_config
from peep.server.qbbs.calibration import Calibration, ObservationNoise
from peep.server.qbbs.errors import (
    FaceScoreUnavailableError,
    OdometerExhaustedError,
    QbbsError,
    QueryShapeError,
    QueryStructureChangedError,
    TraitValueError,
    UnknownSubjectError,
    UnknownTraitError,
)
from peep.server.qbbs.face import ClassifierFaceScores, FaceScoreProvider, RecogniserFaceScores, StaticFaceScores
from peep.server.qbbs.hosting import HostedQbbs
from peep.server.qbbs.matcher import ParzenScoreModel, fused_score, gaussian_log_likelihood
from peep.server.qbbs.module import QbbsModule, QueryResult, TraitScore, VerifyResult
from peep.server.qbbs.odometer import OdometerReading, PrivacyOdometer
from peep.server.qbbs.queries import QueryPlan, SumQuery

__all__ = [
    "DEFAULT_TRAITS",
    "Calibration",
    "ClassifierFaceScores",
    "FaceScoreProvider",
    "FaceScoreUnavailableError",
    "HostedQbbs",
    "ObservationNoise",
    "OdometerExhaustedError",
    "OdometerReading",
    "ParzenScoreModel",
    "PrivacyOdometer",
    "QbbsConfig",
    "QbbsError",
    "QbbsModule",
    "QueryPlan",
    "QueryResult",
    "QueryShapeError",
    "QueryStructureChangedError",
    "RecogniserFaceScores",
    "StaticFaceScores",
    "SumQuery",
    "TraitScore",
    "TraitSpec",
    "TraitValueError",
    "UnknownSubjectError",
    "UnknownTraitError",
    "VerifyResult",
    "fused_score",
    "gaussian_log_likelihood",
    "load_qbbs_config",
]
