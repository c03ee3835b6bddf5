"""Exceptions and warnings raised by PEEP.

Every error names the parameter or file at fault, what was expected and what
was received. Custom errors subclass :class:`ValueError` (or
:class:`TypeError`) so callers can catch them generically, as scikit-learn
and diffprivlib do.
"""

from __future__ import annotations


class NotFittedError(ValueError, AttributeError):
    """An estimator was used before ``fit``."""


class BudgetError(ValueError):
    """A release would exceed a privacy budget; nothing was released."""


class BundleError(ValueError):
    """A projection bundle is missing, unsigned, tampered with or inconsistent.

    The message names the file that failed.
    """


class WireError(ValueError):
    """A template message is malformed or inconsistent (names the field)."""


class TopicError(ValueError):
    """An MQTT topic, topic root or shared-subscription group does not fit the grammar (names the field)."""


class UnsafeFeatureError(RuntimeError):
    """An unsafe mode (e.g. seeded noise) was requested without enabling it by name."""


class PrivacyLeakWarning(RuntimeWarning):
    """Privacy-relevant parameters were derived from the data being protected."""
