"""QBBS hosted by the recognition server: :class:`HostedQbbs`, built by the composition root.

:class:`~peep.server.services.Services` builds it (``Services(config, host_qbbs=True)``, which ``peep serve``,
``peep erase`` and :class:`~peep.server.app.ServerApp` ask for) from ``[qbbs]`` with the parts it needs,
passed in: the serving recogniser, the ingestor, the database. Services then wires it like any of its parts:
its erasure and close hooks, the refit on promotion; the gRPC server adds its servicer
(:meth:`HostedQbbs.add_to`) and the console reads its odometer. Nothing looks the module up.

Configuration (``server.toml``)
-------------------------------
QBBS is hosted when ``server.toml`` has a ``[qbbs]`` table and not otherwise:
soft traits are personal data a deployment opts into, so none are stored, and
no ``QbbsService`` is offered, unless the deployer asks. The table holds the
fields of :class:`~peep.server.config.qbbs.QbbsConfig` (validated when the
server config loads); ``store_path`` and ``ledger_path`` are required when the
server hosts the module (in memory they would be lost on restart, and a lost
ledger resets every subject's ε), relative to ``server.toml``'s directory::

    [qbbs]
    store_path = "/var/lib/peep/qbbs.sqlite"         # soft traits (SQLite, mode 0600)
    ledger_path = "/var/lib/peep/qbbs-spend.jsonl"   # odometer spends = the audit log
    epsilon = 1.0
    epsilon_cap = 100.0

    [qbbs.population]   # optional; whom the calibration simulates, from public knowledge of the site only
    male_fraction = 1.0
    impostor_model = "same-gender"

``[qbbs.population]`` (:class:`~peep.server.config.qbbs.PopulationPrior`)
matters once the traits carry weight: at a site narrower than the general
adult population (one gender, a tight age band) the default calibration
under-estimates how alike impostors are, and the real FAR exceeds
``target_far``. Declare it from what is publicly known of the site, never from
the store. Traits whose weight is 0 (e.g. all of them at ε = 1, where the
calibration keeps the face alone) are not queried and cost no ε.

The same table serves ``peep qbbs enrol|query|odometer|erase --config server.toml``.

What the hosting wires
----------------------
* face scores: the serving model (:class:`peep.server.recognition.recogniser.ServingFaceScores`,
  log P(claimed | template)); the Parzen densities of P(genuine | s) are
  refitted from the new model's validation scores when a model is promoted
  (eagerly, from the recogniser's listener, and lazily on the next
  verification when another process promoted it); the fused threshold (and,
  unless ``weights`` is configured, the weights) is recalibrated with them
  for ``target_far`` (:mod:`peep.server.qbbs.calibration`: simulated claims
  from the new model's validation scores and public trait information, never
  the soft-trait store), for every claim shape seen so far, and logged
  ("QBBS: fused threshold calibrated", with the simulated FAR and GAR);
* erasure: every erasure (``EraseSubject``, ``peep erase``) deletes the
  subject's soft traits too (the odometer's spend ledger is kept: it is the
  audit log, and a re-enrolled id must not get a fresh budget);
* authentication: the server's interceptor authenticates every call and
  requires an admin for EnrolSoftTraits, Query and GetOdometer. VerifyFused
  is open to an admin or a registered device; its template passes the same
  checks as ingest (known bundle, mechanism consistent with the bundle,
  plausible values) and a device may only submit templates with its own
  ``device_id`` (and its registered site), else ``PERMISSION_DENIED``;
* status codes: no trained model yet, or a template of another bundle or
  mechanism domain than the serving model's, is ``FAILED_PRECONDITION`` (as
  for RecognitionService.Verify).

Replicas
--------
With ``storage.backend = "postgres"`` the module keeps its soft traits and its
odometer in that database (``store_path`` and ``ledger_path`` are not used and
need not be set): every replica may host ``[qbbs]``, and the cap holds across
them, because a spend locks the subject's odometer row, checks the cap, computes
the release and records the spend in one transaction
(:class:`~peep.server.qbbs.odometer.DatabaseOdometer`). An erasure handled by any
replica deletes the soft traits every replica reads. With SQLite (one node) the
store is the SQLite file and the odometer the JSONL ledger, exact for one
process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from peep.server.qbbs.errors import FaceScoreUnavailableError, QbbsError

if TYPE_CHECKING:
    import grpc
    from peep.server.config import ServerConfig
    from peep.server.config.qbbs import QbbsConfig
    from peep.server.ingest.ingestor import Ingestor
    from peep.server.qbbs.module import QbbsModule
    from peep.server.recognition.recogniser import Recogniser, ServingFaceScores

__all__ = ["HostedFaceScores", "HostedQbbs", "hosted_config"]

log = logging.getLogger(__name__)


class HostedFaceScores:
    """:class:`~peep.server.recognition.recogniser.ServingFaceScores` with the server's "no model" errors as QBBS's.

    ``ModelUnavailable`` (no model trained) and ``ModelMismatch`` (template of
    another bundle or domain) become :class:`FaceScoreUnavailableError`, which
    the QBBS servicer answers ``FAILED_PRECONDITION``; ``KeyError`` (claimed
    subject not in the model, or erased) and other ``ValueError`` (wrong
    length) pass through as the provider protocol says.
    """

    def __init__(self, inner: ServingFaceScores) -> None:
        self.inner = inner

    @property
    def model_version(self) -> str:
        return self.inner.model_version

    def face_score(self, claimed_subject: str, values: NDArray[np.float32], *, template: Any = None) -> float:
        from peep.server.recognition.recogniser import ModelMismatch, ModelUnavailable

        try:
            return self.inner.face_score(claimed_subject, values, template=template)
        except (ModelUnavailable, ModelMismatch) as exc:
            raise FaceScoreUnavailableError(f"fused verification needs the face score: {exc}") from exc

    def validation_scores(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        from peep.server.recognition.recogniser import ModelUnavailable

        try:
            return self.inner.validation_scores()
        except ModelUnavailable as exc:
            raise FaceScoreUnavailableError(f"fused verification needs the face score: {exc}") from exc


class HostedQbbs:
    """The QBBS module as the server hosts it, and what the server's parts call on it.

    Build it with :meth:`build`; :class:`~peep.server.services.Services` does, and wires :meth:`erase`,
    :meth:`holds`, :meth:`close` and :meth:`refit` into its erasure, close and promotion hooks.

    Parameters
    ----------
    module : QbbsModule
    ingestor : Ingestor
        The server's: a fused verification's template passes the same checks as ingest and is counted as a
        release in its ledger.

    Attributes
    ----------
    module : QbbsModule
        The hosted module (the console shows its odometer).
    """

    def __init__(self, module: QbbsModule, ingestor: Ingestor) -> None:
        self.module = module
        self.ingestor = ingestor

    @classmethod
    def build(
        cls,
        config: QbbsConfig,
        *,
        recogniser: Recogniser,
        ingestor: Ingestor,
        connect: Callable[[], Any] | None = None,
    ) -> HostedQbbs:
        """Open the module of ``config`` (from :func:`hosted_config`) on the serving model's face scores.

        Parameters
        ----------
        config : QbbsConfig
        recogniser : Recogniser
            The serving one: its model gives the face scores (:class:`HostedFaceScores`).
        ingestor : Ingestor
        connect : callable returning a psycopg connection, optional
            The server's PostgreSQL (its migrations made QBBS's tables): soft traits and odometer are kept
            there, shared by replicas. ``None``: the files ``store_path`` and ``ledger_path``.
        """
        from peep.server.qbbs.module import QbbsModule
        from peep.server.recognition.recogniser import ServingFaceScores

        if connect is not None and (config.store_path is not None or config.ledger_path is not None):
            log.warning(
                "QBBS keeps its soft traits and odometer in PostgreSQL (storage.dsn); qbbs.store_path and "
                "qbbs.ledger_path are not used"
            )
        faces = HostedFaceScores(ServingFaceScores(recogniser))
        module = QbbsModule(config, face_scores=faces, connect=connect)
        log.info(
            "QBBS hosted",
            extra={"traits": sorted(config.traits), "epsilon_cap": config.epsilon_cap, "subjects": module.n_subjects()},
        )
        return cls(module, ingestor)

    # ------------------------------------------------------------ what Services wires

    def erase(self, subject: str) -> int:
        """Delete the subject's soft traits (the odometer's spends stay: they are the audit log); how many."""
        return int(self.module.erase(subject))

    def holds(self, subject: str) -> bool:
        """Whether :meth:`erase` would delete anything of ``subject`` (deleting nothing)."""
        return bool(self.module.enrolled_traits(subject))

    def close(self) -> None:
        self.module.close()

    def refit(self, model: Any) -> None:
        """A model was promoted: refit P(genuine | face score) and recalibrate now (the recogniser's listener).

        Eagerly, so the first verification after a promotion does not pay for it (and a model whose
        validation scores cannot be fitted is reported now); the module refits lazily too, and a stale
        calibration is redone on the next verification of its shape.
        """
        try:
            parzen = self.module.face_model()
            log.info(
                "QBBS: P(genuine | face score) refitted", extra={"model_version": model.version, **parzen.describe()}
            )
            self.module.recalibrate()  # logs each calibration
        except (FaceScoreUnavailableError, QbbsError) as exc:
            log.warning(
                "QBBS: P(genuine | face score) not refitted or not recalibrated",
                extra={"model_version": model.version, "error": str(exc)},
            )

    # ------------------------------------------------------------ what the gRPC server calls

    def add_to(self, server: grpc.Server) -> None:
        """Add ``QbbsService`` to the gRPC server, behind its interceptors (authentication, limits)."""
        from peep.server.ingest.auth import authorize_admin
        from peep.server.qbbs.service import add_qbbs_servicer

        add_qbbs_servicer(
            server,
            self.module,
            authorize_admin=authorize_admin,
            check_template=self._check_template,
            requester=_requester,
        )

    def _check_template(self, context: grpc.ServicerContext, template: Any) -> None:
        """The ingest checks: validation (Rejection, a WireError: INVALID_ARGUMENT), then who may send it.

        A template that passes is counted in the ingest ledger (``Ingestor.record_release``), so a door's fused
        claims show on the console's Devices page like its other releases.
        """
        import grpc
        from peep.server.ingest.auth import current_identity
        from peep.server.ingest.ingestor import PermissionRefused, Sender

        try:
            valid = self.ingestor.check(template, Sender(identity=current_identity()))
        except PermissionRefused as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"VerifyFused: {exc}")
        # A door fusing soft traits releases this template for its claim: counted like any release.
        self.ingestor.record_release(valid)


def _requester(context: grpc.ServicerContext) -> str:
    """The authenticated caller and its address, for the odometer's audit log."""
    from peep.server.ingest.auth import current_identity

    ident = current_identity()
    who = "unauthenticated" if ident is None else f"{'admin' if ident.is_admin else 'device'}:{ident.name}"
    return f"{who} {context.peer()}"


def hosted_config(config: ServerConfig) -> QbbsConfig | None:
    """The hosted module's :class:`QbbsConfig` from ``[qbbs]``, or ``None`` when the table is absent.

    Reads the configuration only (nothing is opened), so the composition root checks it before it builds
    anything.

    Raises
    ------
    peep.server.config.ConfigError
        The table lacks ``store_path`` or ``ledger_path`` (SQLite: QBBS keeps them in files).
    """
    from peep.server.config import ConfigError
    from peep.server.config.qbbs import load_qbbs_config

    section = config.qbbs
    if section is None:
        log.info("QBBS not hosted: server.toml has no [qbbs] table")
        return None
    cfg = load_qbbs_config(None, **section)  # already validated (and paths resolved) with server.toml
    if config.storage.backend == "postgres":
        return cfg  # soft traits and odometer live in the database
    missing = [
        (
            f"qbbs.{key}",
            "expected a file path when the server hosts QBBS (in memory, soft traits and the odometer's "
            "spends would be lost on restart, resetting every subject's ε)",
            None,
        )
        for key in ("store_path", "ledger_path")
        if getattr(cfg, key) is None
    ]
    if missing:
        raise ConfigError("server.toml [qbbs]", missing)
    return cfg
