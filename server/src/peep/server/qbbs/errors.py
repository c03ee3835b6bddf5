"""Errors raised by the soft-biometric query module.

Each names the parameter or field at fault, what was expected and what was
received. They subclass :class:`ValueError` (via :class:`QbbsError`) or
:class:`~peep.core.exceptions.BudgetError` so callers can catch them
generically; the gRPC service maps them to status codes with the same text.
"""

from __future__ import annotations

from peep.core.exceptions import BudgetError


class QbbsError(ValueError):
    """Base class of the query module's input errors (gRPC ``INVALID_ARGUMENT``)."""


class UnknownTraitError(QbbsError):
    """A trait name is not one of the deployment's configured traits."""


class TraitValueError(QbbsError):
    """A trait value is not a finite number inside the trait's declared range."""


class UnknownSubjectError(QbbsError):
    """The subject has no enrolled value for the requested trait (gRPC ``NOT_FOUND``)."""


class QueryShapeError(QbbsError):
    """A query that is not one of the fixed, permissible SUM queries was requested.

    The module answers only the query structure fixed before enrolment
    (m SUM queries per trait and claimed subject); anything else -- another
    aggregate, another subject set, a single raw response -- is refused.
    """


class QueryStructureChangedError(QbbsError):
    """The configured query structure differs from the one fixed when the store was first used."""


class OdometerExhaustedError(BudgetError):
    """Answering would push a subject's cumulative ε past the odometer's cap.

    Nothing was released and nothing was recorded (gRPC ``RESOURCE_EXHAUSTED``).
    """


class FaceScoreUnavailableError(RuntimeError):
    """Fused verification needs a face-score provider, and none is configured or it failed."""
