"""The bundles the server knows: verified, stored, served, announced.

Every bundle is verified against the deployer's pinned public key before it
is stored or used (:meth:`ProjectionBundle.from_files`); bundles read back from
the database are verified again, so a tampered row is refused too. The most
recently published bundle is the *current* one: ``GetBundle`` serves it and
the MQTT retained announcement carries it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from peep.core.bundle import ProjectionBundle
from peep.core.exceptions import BundleError
from peep.core.projections.descriptor import DLIB_RESNET_MODEL_SHA256, untrusted_network
from peep.server.storage import Store
from peep.v1 import recognition_pb2

__all__ = ["BundleCatalog", "bundle_files_message", "files_from_message"]

log = logging.getLogger(__name__)

_MISS_TTL_S = 5.0
_CURRENT_TTL_S = 5.0


def bundle_files_message(bundle: ProjectionBundle) -> recognition_pb2.BundleFiles:
    """A bundle as the ``BundleFiles`` message (files in name order)."""
    msg = recognition_pb2.BundleFiles(bundle_id=bundle.bundle_id)
    for name in sorted(bundle.files):
        msg.files.add(name=name, content=bundle.files[name])
    return msg


def files_from_message(msg: recognition_pb2.BundleFiles) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for f in msg.files:
        if f.name in files:
            raise BundleError(f"files: {f.name} appears twice")
        files[f.name] = bytes(f.content)
    return files


class BundleCatalog:
    """Verified bundles by id, backed by the store.

    Parameters
    ----------
    store : Store
    public_key : Ed25519PublicKey
        The deployer's key; nothing else is accepted.
    trusted_models : iterable of str, optional
        SHA-256 of the descriptor model files a descriptor bundle
        (``dlib-resnet``) may name (``[bundle] trusted_descriptor_models``;
        default: :data:`peep.core.projections.descriptor.DLIB_RESNET_MODEL_SHA256`).
        A bundle naming another network is refused at publish; one already
        stored (published under another configuration) is refused at ingest
        (:meth:`untrusted`).
    """

    def __init__(
        self, store: Store, public_key: Ed25519PublicKey, *, trusted_models: Iterable[str] | None = None
    ) -> None:
        self._store = store
        self._key = public_key
        self._trusted = frozenset(DLIB_RESNET_MODEL_SHA256.values() if trusted_models is None else trusted_models)
        self._lock = threading.Lock()
        self._bundles: dict[str, ProjectionBundle] = {}
        self._misses: dict[str, float] = {}
        self._current: ProjectionBundle | None = None
        self._current_checked = 0.0
        self._listeners: list[Callable[[ProjectionBundle], None]] = []

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The pinned key every bundle must verify against."""
        return self._key

    def add_listener(self, fn: Callable[[ProjectionBundle], None]) -> None:
        """Call ``fn(bundle)`` after each publish (e.g. the MQTT retained announcement)."""
        self._listeners.append(fn)

    def untrusted(self, bundle: ProjectionBundle) -> str | None:
        """Why ``bundle``'s descriptor network is not trusted here (None: trusted, or pixel input)."""
        return untrusted_network(bundle.input, self._trusted)

    def publish(self, files: Mapping[str, bytes]) -> ProjectionBundle:
        """Verify, store and make current; raises :class:`BundleError` naming the failing file."""
        bundle = ProjectionBundle.from_files(files, self._key)
        reason = self.untrusted(bundle)
        if reason is not None:
            raise BundleError(
                f"bundle {bundle.bundle_id}: {reason} (the server trusts the descriptor models listed in "
                "[bundle] trusted_descriptor_models)"
            )
        payload = bundle_files_message(bundle).SerializeToString(deterministic=True)
        self._store.put_bundle(bundle.bundle_id, payload, time.time())
        with self._lock:
            self._bundles[bundle.bundle_id] = bundle
            self._misses.pop(bundle.bundle_id, None)
            self._current = bundle
            self._current_checked = time.monotonic()
        log.info("bundle published", extra={"bundle_id": bundle.bundle_id, "n_components": bundle.n_components})
        for fn in self._listeners:
            try:
                fn(bundle)
            except Exception:
                log.exception("bundle listener failed", extra={"bundle_id": bundle.bundle_id})
        return bundle

    def _load(self, payload: bytes) -> ProjectionBundle:
        msg = recognition_pb2.BundleFiles()
        msg.ParseFromString(payload)
        return ProjectionBundle.from_files(files_from_message(msg), self._key)

    def get(self, bundle_id: str) -> ProjectionBundle | None:
        """The verified bundle ``bundle_id``, or None when this server does not know it."""
        b = self._bundles.get(bundle_id)
        if b is not None:
            return b
        now = time.monotonic()
        with self._lock:
            miss = self._misses.get(bundle_id)
            if miss is not None and now - miss < _MISS_TTL_S:
                return None
        payload = self._store.get_bundle(bundle_id)
        if payload is None:
            with self._lock:
                if len(self._misses) > 10_000:  # random ids from a fuzzer must not grow memory
                    self._misses.clear()
                self._misses[bundle_id] = now
            return None
        try:
            b = self._load(payload)
        except (BundleError, ValueError) as exc:
            log.error("stored bundle failed verification", extra={"bundle_id": bundle_id, "error": str(exc)})
            return None
        with self._lock:
            self._bundles[bundle_id] = b
        return b

    def current(self) -> ProjectionBundle | None:
        """The most recently published bundle (re-read from the store every few seconds for replicas)."""
        now = time.monotonic()
        if self._current is not None and now - self._current_checked < _CURRENT_TTL_S:
            return self._current
        payload = self._store.get_bundle(None)
        with self._lock:
            self._current_checked = now
        if payload is None:
            return self._current
        msg = recognition_pb2.BundleFiles()
        msg.ParseFromString(payload)
        if self._current is not None and self._current.bundle_id == msg.bundle_id:
            return self._current
        b = self.get(msg.bundle_id)
        if b is not None:
            with self._lock:
                self._current = b
        return self._current
