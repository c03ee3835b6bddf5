"""Release policy: at most k releases per track per window, within per-track ε budgets.

Repeated releases of the same face compose (their ε add up), so the agent
bounds both how often a track is released and how much ε it may spend in
total. The budgets are in **per-vector ε** (what protects the person), and
each release costs the template's per-vector ε plus the ε of any attached
soft traits. Order per release, following the core accountant's contract:
:meth:`ReleasePolicy.decide` (rate limit, then ``accountant.check``) before
any noise is drawn; :meth:`ReleasePolicy.record` (``accountant.spend``,
persisted) after the noise and before the template is queued.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peep.core.accounting import PrivacyAccountant, Spend
from peep.core.exceptions import BudgetError
from peep.edge.config import PrivacyConfig
from peep.edge.errors import ConfigError
from peep.edge.tracking import Track

# Frame timestamps are float sums (index / fps); compare times with a tolerance
# far below any frame interval.
_TIME_TOL = 1e-6


@dataclass(frozen=True)
class Decision:
    """Whether a track may release now; ``reason`` says why not."""

    allowed: bool
    reason: str = ""


class ReleasePolicy:
    """Per-track rate limit and ε budgets.

    Parameters
    ----------
    accountant : PrivacyAccountant
        Its default ``epsilon_budget`` is the per-track budget; ``device:<id>``
        may carry an override (the device cap).
    releases_per_window : int
        k. Releases of one track are also at least ``window_s / k`` apart.
    window_s : float
        Sliding window length in seconds of source time.
    min_hits : int
        Frames a track must have been seen in before its first release.
    cost_epsilon, cost_delta : float
        Per-vector ε (and δ) of one release, soft traits included.
    device_key : str or None
        Also spend under this key (the device cap) when set.
    on_suppressed : callable(reason), optional
    """

    def __init__(
        self,
        *,
        accountant: PrivacyAccountant,
        releases_per_window: int,
        window_s: float,
        min_hits: int,
        cost_epsilon: float,
        cost_delta: float = 0.0,
        device_key: str | None = None,
        on_suppressed: Callable[[str], None] | None = None,
    ) -> None:
        if releases_per_window < 1 or window_s <= 0 or min_hits < 1:
            raise ValueError(
                "releases_per_window/window_s/min_hits: expected >= 1, > 0, >= 1, received "
                f"{releases_per_window}, {window_s}, {min_hits}"
            )
        self.accountant = accountant
        self.k = releases_per_window
        self.window_s = window_s
        # Releases are spread out: k near-identical frames in a burst would let a
        # receiver average away noise without adding any new information.
        self.min_spacing_s = window_s / releases_per_window
        self.min_hits = min_hits
        self.cost_epsilon = cost_epsilon
        self.cost_delta = cost_delta
        self.device_key = device_key
        self._on_suppressed = on_suppressed
        self.suppressed: dict[str, int] = {}

    @staticmethod
    def key(track: Track) -> str:
        return f"track:{track.id}"

    def _suppress(self, reason: str) -> Decision:
        self.suppressed[reason] = self.suppressed.get(reason, 0) + 1
        if self._on_suppressed is not None:
            self._on_suppressed(reason)
        return Decision(False, reason)

    def decide(self, track: Track, t: float) -> Decision:
        """May ``track`` release at source time ``t``? Counts suppressions."""
        if track.hits < self.min_hits:
            return Decision(False, "warming_up")
        while track.releases and t - track.releases[0] >= self.window_s - _TIME_TOL:
            track.releases.popleft()
        if track.exhausted:
            return self._suppress("budget")
        if len(track.releases) >= self.k or (
            track.releases and t - track.releases[-1] < self.min_spacing_s - _TIME_TOL
        ):
            return self._suppress("rate")
        try:
            self.accountant.check(self.key(track), self.cost_epsilon, self.cost_delta)
        except BudgetError:
            track.exhausted = True
            return self._suppress("budget")
        if self.device_key is not None:
            try:
                self.accountant.check(self.device_key, self.cost_epsilon, self.cost_delta)
            except BudgetError:
                return self._suppress("device_budget")
        return Decision(True)

    def record(
        self,
        track: Track,
        t: float,
        *,
        epsilon: float,
        delta: float = 0.0,
        epsilon_coordinate: float,
        message_id: str = "",
    ) -> Spend:
        """Persist the spend of a release that was allowed (``epsilon`` per vector)."""
        for key in (self.device_key, self.key(track)):
            if key is not None:
                spend = self.accountant.spend(
                    key,
                    epsilon,
                    delta,
                    epsilon_coordinate=epsilon_coordinate,
                    purpose="identify",
                    message_id=message_id,
                )
        track.releases.append(t)
        return spend


def check_budget_allows_release(
    privacy: PrivacyConfig,
    *,
    release_epsilon_vector: float,
    release_epsilon_coordinate: float,
    soft_epsilon: float,
) -> None:
    """Raise :class:`ConfigError` if the budgets cannot pay for even one release.

    Parameters
    ----------
    release_epsilon_vector, release_epsilon_coordinate : float
        Guarantee of one template under the configured mechanism and the bundle.
    soft_epsilon : float
        ε of the soft traits attached to each release (0 when disabled).
    """
    cost = release_epsilon_vector + soft_epsilon
    detail = (
        f"one release costs per-vector ε={release_epsilon_vector:g} (per-coordinate "
        f"ε={release_epsilon_coordinate:g})" + (f" + soft traits ε={soft_epsilon:g}" if soft_epsilon else "")
    )
    problems = []
    for name, value in (
        ("track_budget", privacy.track_budget),
        ("device_budget", privacy.device_budget),
        ("enroll_budget", privacy.enroll_budget),
    ):
        if value is not None and value < cost * (1.0 - 1e-9):
            problems.append(
                (
                    f"privacy.{name}",
                    f"expected at least {cost:g} per-vector ε ({detail}), received {value:g}",
                )
            )
    if problems:
        raise ConfigError(problems)
