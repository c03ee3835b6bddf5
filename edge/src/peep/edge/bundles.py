"""The bundle a device releases with: the configured one verified at start, and every later one checked.

:meth:`BundleGate.open` verifies ``bundle.path`` against the pinned public key and builds its releaser from the
device configuration; the configured bundle fixes the largest per-vector ε any later bundle may give.

Bundle updates from the retained ``peep/v1/bundle`` topic are applied between frames (:meth:`BundleGate.offer`),
only if they verify against the pinned key, are not older than the current bundle, and do not raise the
per-vector ε of a release above what the configured bundle gives (``peep-raw``'s per-vector ε depends on the
bundle's bounds). Accepted updates are stored in ``<state_dir>/bundle`` and preferred at the next start (after
the same checks).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peep.core.bundle import ProjectionBundle, load_public_key, write_bundle_files
from peep.core.exceptions import BundleError
from peep.core.release import TemplateReleaser, secure_releaser
from peep.core.sitekey import SiteKey, SiteKeyError
from peep.edge.config import EdgeConfig
from peep.edge.embedding import DescriptorEncoder, encoder_for_bundle
from peep.edge.errors import ConfigError
from peep.edge.logs import log_event
from peep.edge.metrics import EdgeMetrics

# The agent's logger: a bundle's events are the agent's, wherever the checks live.
_log = logging.getLogger("peep.edge.agent")

UPDATED_BUNDLE_DIR = "bundle"


class BundleRefused(ConfigError):
    """The configured bundle failed verification, or lacks what the mechanism releases.

    A configuration error (exit 2, as from ``--validate-config``): ``bundle.path``
    names a bundle this device must not use; the message names the file at fault.
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__([("bundle.path", f"refusing to start with {str(path)!r}: {reason}")])


class BundleGate:
    """What every bundle after the configured one must pass: the pinned key, no downgrade, no wider ε.

    Parameters
    ----------
    cfg : EdgeConfig
    public_key : Ed25519PublicKey
        The pinned key (``bundle.public_key``) every bundle must verify against.
    site_key : SiteKey or None
        The site's key (``privacy.site_key``), for every releaser built.
    epsilon_vector_cap : float
        The per-vector ε of a release under the configured bundle: no later bundle may give more.
    """

    def __init__(self, cfg: EdgeConfig, public_key: Any, site_key: SiteKey | None, epsilon_vector_cap: float) -> None:
        self.cfg = cfg
        self.public_key = public_key
        self.site_key = site_key
        self.epsilon_vector_cap = epsilon_vector_cap

    @classmethod
    def open(cls, cfg: EdgeConfig) -> tuple[BundleGate, TemplateReleaser, DescriptorEncoder | None]:
        """The gate, releaser and descriptor encoder of ``cfg``'s bundle (or of a stored update that passes).

        Raises
        ------
        ConfigError
            When the public key, the bundle folder or the site key cannot be read; :class:`BundleRefused` when
            the bundle does not verify or lacks what the mechanism or the descriptor needs.
        """
        try:
            public_key = load_public_key(cfg.bundle.public_key)
        except BundleError as exc:
            raise ConfigError(f"bundle.public_key: {exc}") from None
        if not cfg.bundle.path.is_dir():
            raise ConfigError(
                f"bundle.path: expected a bundle directory, received {str(cfg.bundle.path)!r} (not a directory)"
            )
        try:
            bundle = ProjectionBundle.load(cfg.bundle.path, public_key)
        except BundleError as exc:
            raise BundleRefused(cfg.bundle.path, str(exc)) from None
        p = cfg.privacy
        site_key: SiteKey | None = None
        if p.site_key is not None:
            try:
                site_key = SiteKey.load(p.site_key)
            except SiteKeyError as exc:
                raise ConfigError(f"privacy.site_key: {exc}") from None
        try:
            releaser = secure_releaser(bundle, kind=p.mechanism, epsilon=p.epsilon, delta=p.delta,
                                     site_key=site_key)  # fmt: skip
        except BundleError as exc:
            # e.g. a unit-sphere mechanism with a bundle whose projector has no 'unit' output
            raise BundleRefused(cfg.bundle.path, str(exc)) from None
        # The configured bundle fixes the largest per-vector ε any later bundle may give.
        gate = cls(cfg, public_key, site_key, releaser.mechanism.epsilon_vector_cap)
        try:
            # A descriptor bundle needs its network on the device, the very one it was built with.
            encoder = gate.encoder(bundle)
        except BundleError as exc:
            raise BundleRefused(cfg.bundle.path, str(exc)) from None
        updated = cfg.device.state_dir / UPDATED_BUNDLE_DIR
        if cfg.bundle.accept_updates and updated.is_dir():
            try:
                candidate = ProjectionBundle.load(updated, public_key)
                releaser, encoder = gate.check(candidate, releaser.bundle)
                log_event(
                    _log,
                    logging.INFO,
                    "bundle_update_restored",
                    bundle_id=candidate.bundle_id,
                    path=str(updated),
                )
            except (BundleError, ValueError) as exc:
                log_event(
                    _log,
                    logging.WARNING,
                    "bundle_update_ignored",
                    path=str(updated),
                    error=str(exc),
                )
        return gate, releaser, encoder

    def check(
        self, candidate: ProjectionBundle, current: ProjectionBundle
    ) -> tuple[TemplateReleaser, DescriptorEncoder | None]:
        """A releaser (and the descriptor encoder it needs) for a verified candidate bundle, or ValueError."""
        p = self.cfg.privacy
        if candidate.manifest.created_at < current.manifest.created_at:
            raise ValueError(
                f"bundle {candidate.bundle_id} was created {candidate.manifest.created_at}, "
                "before the current "
                f"bundle {current.bundle_id} ({current.manifest.created_at}); refusing a downgrade"
            )
        releaser = secure_releaser(
            candidate, kind=p.mechanism, epsilon=p.epsilon, delta=p.delta, site_key=self.site_key
        )
        g = releaser.mechanism.guarantee
        if g.epsilon_vector > self.epsilon_vector_cap * (1 + 1e-9):
            raise ValueError(
                f"bundle {candidate.bundle_id} would raise the per-vector ε of a release from "
                f"{self.epsilon_vector_cap:g} to {g.epsilon_vector:g} (per-coordinate ε "
                f"{g.epsilon_coordinate:g}); "
                "only the device configuration may do that"
            )
        return releaser, self.encoder(candidate)

    def encoder(self, bundle: ProjectionBundle) -> DescriptorEncoder | None:
        """The descriptor encoder ``bundle`` needs (None for pixels), on the configured back end."""
        d = self.cfg.descriptor
        return encoder_for_bundle(bundle.input, bundle_id=bundle.bundle_id, backend=d.backend, threads=d.threads,
                                  cache_dir=d.cache_dir)  # fmt: skip

    def offer(
        self,
        payload: bytes,
        current: TemplateReleaser,
        *,
        cost_of: Callable[[TemplateReleaser], float],
        switch: Callable[[TemplateReleaser, DescriptorEncoder | None], None],
        metrics: EdgeMetrics,
    ) -> None:
        """Hand ``switch`` the releaser and encoder of an announced bundle (``BundleFiles``) that passes.

        An announcement of the bundle in use is skipped; one that does not verify, is older, widens ε or would
        cost more than ``privacy.track_budget`` per release (``cost_of``: its per-vector ε) is counted and
        logged, never taken. An accepted bundle is stored for the next start once ``switch`` has it.
        """
        from peep.v1 import recognition_pb2

        try:
            msg = recognition_pb2.BundleFiles.FromString(payload)
            files = {f.name: bytes(f.content) for f in msg.files}
            if msg.bundle_id and msg.bundle_id == current.bundle_id:
                return
            candidate = ProjectionBundle.from_files(files, self.public_key)
            if candidate.bundle_id == current.bundle_id:
                return
            releaser, encoder = self.check(candidate, current.bundle)
            cost = cost_of(releaser)
            if cost > self.cfg.privacy.track_budget:
                raise ValueError(f"one release would cost per-vector ε={cost:g}, more than privacy.track_budget")
        except Exception as exc:  # DecodeError, BundleError, ValueError: never take an unverified bundle
            metrics.bundle_updates.labels(result="rejected").inc()
            log_event(_log, logging.ERROR, "bundle_update_rejected", error=str(exc))
            return
        previous = current.bundle_id
        switch(releaser, encoder)
        metrics.bundle_updates.labels(result="accepted").inc()
        g = releaser.mechanism.guarantee
        log_event(
            _log,
            logging.INFO,
            "bundle_update_accepted",
            bundle_id=candidate.bundle_id,
            previous=previous,
            epsilon_coordinate=float(g.epsilon_coordinate),
            epsilon_vector=float(g.epsilon_vector),
        )
        state_dir = self.cfg.device.state_dir
        target = state_dir / UPDATED_BUNDLE_DIR
        try:
            tmp = state_dir / f".{UPDATED_BUNDLE_DIR}.new"
            shutil.rmtree(tmp, ignore_errors=True)
            write_bundle_files(candidate.files, tmp)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        except OSError as exc:
            log_event(_log, logging.WARNING, "bundle_update_not_persisted", error=str(exc))
