"""A door's question before it releases anything: does the serving model know the subject being claimed?

A badge reader can type any id. Were the door to release a VERIFY template for each, a stream of made-up ids
would spend the ε of whoever stands in front of the camera on answers that can only be "no such subject".
So a door asks first, without a template (gRPC ``CheckClaim``, or a message on its MQTT ``claims`` topic),
and releases only for a subject the model can decide.

The answer says no more than ``Verify`` already does (it answers ``NOT_FOUND`` for an unknown subject), but
it costs the asker nothing, so each device gets a bounded rate of questions (a token bucket): a hostile
device cannot list the enrolled people at wire speed (:class:`~peep.server.rates.CallerRate`, the bucket the
other per-device calls use).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from peep.server.rates import CallerRate, CallsTooFrequent

__all__ = ["ClaimChecker", "ClaimChecksTooFrequent"]


class ClaimChecksTooFrequent(CallsTooFrequent):
    """A device asked about claims faster than its rate (RESOURCE_EXHAUSTED over gRPC)."""


@dataclass(frozen=True)
class ClaimCheck:
    """The answer: whether ``subject`` is known to the serving model ``model_version``."""

    subject: str
    known: bool
    model_version: str


class ClaimChecker:
    """Answers doors' claim checks from the recogniser's serving model, within a per-device rate.

    Parameters
    ----------
    recogniser : Recogniser
        Its serving model (``require_model``) and erasures (``is_masked``).
    background_prefix : str
        Subjects with this prefix are public background people, never claimable.
    rate_per_s, burst : float
        Each caller's token bucket: ``burst`` questions at once, then ``rate_per_s`` a second.
    clock : callable
        Monotonic seconds (injected in tests).
    """

    def __init__(
        self,
        recogniser: Any,
        *,
        background_prefix: str = "background:",
        rate_per_s: float = 5.0,
        burst: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.recogniser, self.background_prefix = recogniser, background_prefix
        self.rate = CallerRate("claim checks", rate_per_s=rate_per_s, burst=burst, clock=clock)

    @property
    def rate_per_s(self) -> float:
        return self.rate.rate_per_s

    @property
    def burst(self) -> float:
        return self.rate.burst

    def check(self, caller: str, subject: str) -> ClaimCheck:
        """Whether the serving model knows ``subject`` (an id already checked by the caller).

        Raises
        ------
        ClaimChecksTooFrequent
            When ``caller`` has used up its rate.
        ModelUnavailable
            When no model has been trained yet.
        """
        self._admit(caller)
        m = self.recogniser.require_model()
        known = (
            subject in m.class_index
            and not subject.startswith(self.background_prefix)
            and not self.recogniser.is_masked(subject, m)
        )
        return ClaimCheck(subject, bool(known), str(m.version))

    def _admit(self, caller: str) -> None:
        try:
            self.rate.admit(caller)
        except CallsTooFrequent as exc:
            raise ClaimChecksTooFrequent(str(exc)) from None
