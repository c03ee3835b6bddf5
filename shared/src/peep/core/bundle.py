"""Signed bundles: ONNX projector + metadata + Ed25519 signature.

A bundle directory holds::

    projector.onnx   faces (N, D) float32 in [0,1] -> coefficients and the
                     coefficients in every release domain (scaled,
                     box_clipped, l2_clipped, l1_clipped, ...; each (N, nc)
                     float32; see peep.core.domains)
    metadata.json    projection kind, geometry, preprocessing, nc, bounds,
                     radii, mechanism defaults, provenance
    manifest.json    format, bundle_id, SHA-256 of every file above, key id
    signature.sig    JSON: SHA-256 of manifest.json + Ed25519 signature of it

The bundle id is derived from the content hashes, so it names exactly one
projector. Loading verifies the signature against a pinned public key, then
every hash, and only then parses anything; any changed byte fails with a
:class:`~peep.core.exceptions.BundleError` naming the file. The projector's
arrays are also readable as numpy (:meth:`ProjectionBundle.model`) so the
numpy and onnxruntime paths can be compared and reconstruction attacks can be
audited.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from numpy.typing import ArrayLike, NDArray
from peep.core.bounding import BundleBounds
from peep.core.exceptions import BundleError
from peep.core.imaging import FaceGeometry

if TYPE_CHECKING:
    from peep.core.eigenface_model import EigenfaceModel
    from peep.core.projections.base import Projection

# The onnx package (graph building/reading) and scipy (via eigenfaces) are
# imported where used: a device only *runs* projectors with onnxruntime, and
# importing them would cost ~25 MB of a Pi's memory for nothing.

FORMAT = "peep-bundle/1"
PROJECTOR = "projector.onnx"
METADATA = "metadata.json"
MANIFEST = "manifest.json"
SIGNATURE = "signature.sig"
BUNDLE_FILES = (PROJECTOR, METADATA, MANIFEST, SIGNATURE)
#: Projection of a bundle whose metadata names none (bundles built before projections had kinds).
LEGACY_PROJECTION = "eigenfaces"


# --------------------------------------------------------------------- keys


def generate_keypair() -> tuple[bytes, bytes]:
    """A new Ed25519 key pair as (private PEM, public PEM)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def write_keypair(prefix: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``PREFIX.key`` (mode 0600) and ``PREFIX.pub``; refuse to overwrite."""
    key_path, pub_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    for p in (key_path, pub_path):
        if p.exists():
            raise FileExistsError(f"--out: {p} already exists; refusing to overwrite a key")
    key_path.parent.mkdir(parents=True, exist_ok=True)
    private, public = generate_keypair()
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    pub_path.write_bytes(public)
    return key_path, pub_path


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Read an Ed25519 private key (PEM, unencrypted)."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise BundleError(
            f"signing key {path}: expected an Ed25519 private key in PEM, could not read it ({exc})"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise BundleError(f"signing key {path}: expected an Ed25519 private key, received {type(key).__name__}")
    return key


def load_public_key(path_or_pem: str | os.PathLike[str] | bytes) -> Ed25519PublicKey:
    """Read an Ed25519 public key from a PEM file path or PEM bytes.

    Errors say what was expected and what was received (the file's path, never
    a Python ``repr``; an X.509 certificate, another kind of key, or no key at
    all), so a caller only prefixes the option or key it came from.
    """
    received = "PEM bytes" if isinstance(path_or_pem, bytes) else repr(os.fspath(path_or_pem))
    try:
        pem = path_or_pem if isinstance(path_or_pem, bytes) else Path(path_or_pem).read_bytes()
    except OSError as exc:
        raise BundleError(
            f"expected a readable Ed25519 public key file (PEM), received {received} ({exc.strerror})"
        ) from None
    if b"-----BEGIN CERTIFICATE-----" in pem:
        raise BundleError(
            "expected the deployer's Ed25519 public key (PEM 'PUBLIC KEY', as written by 'peep keys generate'), "
            f"received an X.509 certificate in {received}"
        )
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise BundleError(f"expected an Ed25519 public key in PEM, received {received} ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BundleError(f"expected an Ed25519 public key, received a {type(key).__name__} in {received}")
    return key


def key_id(public_key: Ed25519PublicKey) -> str:
    """Short fingerprint of a public key (first 16 hex of SHA-256 of its raw bytes)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


# ------------------------------------------------------------------ writing


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical_json(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def build_bundle_files(
    *,
    projection: Projection,
    geometry: FaceGeometry,
    signing_key: Ed25519PrivateKey,
    normalisation: Mapping[str, Any],
    mechanism_defaults: Mapping[str, Any],
    provenance: Mapping[str, Any] | None = None,
    created_at: float | None = None,
) -> dict[str, bytes]:
    """All files of a signed bundle, in memory.

    Parameters
    ----------
    projection : Projection
        A fitted projection (:mod:`peep.core.projections`, e.g.
        :class:`~peep.core.projections.EigenfaceProjection`), with its public
        bounds ``bounds_``; fitted on public faces only.
    normalisation : mapping
        How faces were detected and normalised (e.g. ``{"detector": "haar", ...}``);
        devices must use the same.
    mechanism_defaults : mapping
        Suggested ``kind``/``epsilon``/``delta``. Advisory only: a device's own
        configuration decides its noise and a bundle can never raise ε.
    provenance : mapping, optional
        Dataset name, number of faces and subjects, software version.
    """
    projector = projection.to_onnx()
    metadata = {
        "format": FORMAT,
        "projection": projection.kind,
        "input": projection.input_description(),
        "geometry": geometry.to_dict(),
        "n_components": int(projection.n_components_),
        "n_features": int(projection.n_features_in_),
        "normalisation": dict(normalisation),
        "bounds": projection.bounds_.to_dict(),
        "mechanism_defaults": dict(mechanism_defaults),
        **projection.metadata(),
        "provenance": dict(provenance or {}),
    }
    meta_bytes = _canonical_json(metadata)
    hashes = {PROJECTOR: _sha256(projector), METADATA: _sha256(meta_bytes)}
    bundle_id = "eb-" + _sha256(_canonical_json(hashes))[:20]
    manifest = {
        "format": FORMAT,
        "bundle_id": bundle_id,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created_at)),
        "files": hashes,
        "key_id": key_id(signing_key.public_key()),
    }
    manifest_bytes = _canonical_json(manifest)
    signature = {
        "algorithm": "ed25519",
        "key_id": manifest["key_id"],
        "manifest_sha256": _sha256(manifest_bytes),
        "signature": base64.b64encode(signing_key.sign(manifest_bytes)).decode(),
    }
    return {
        PROJECTOR: projector,
        METADATA: meta_bytes,
        MANIFEST: manifest_bytes,
        SIGNATURE: _canonical_json(signature),
    }


def write_bundle_files(files: Mapping[str, bytes], out_dir: str | os.PathLike[str]) -> Path:
    """Write bundle files atomically (a reader never sees a half-written bundle)."""
    out = Path(out_dir)
    unknown = set(files) - set(BUNDLE_FILES)
    if unknown:
        raise BundleError(f"files: expected only {list(BUNDLE_FILES)}, received {sorted(unknown)}")
    out.mkdir(parents=True, exist_ok=True)
    for name in BUNDLE_FILES:
        if name not in files:
            raise BundleError(f"{name}: missing from the bundle being written")
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as fh:
            fh.write(files[name])
            fh.flush()
            os.fsync(fh.fileno())
        # Bundles are public (devices read them); only keys are secret.
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / name)
    return out


def read_bundle_files(bundle_dir: str | os.PathLike[str]) -> dict[str, bytes]:
    """Raw bytes of the four bundle files (no verification)."""
    d = Path(bundle_dir)
    if not d.is_dir():
        raise BundleError(f"{d}: expected a bundle directory, it does not exist or is not a directory")
    files: dict[str, bytes] = {}
    for name in BUNDLE_FILES:
        p = d / name
        if not p.is_file():
            raise BundleError(f"{name}: missing from bundle {d} (unsigned or incomplete bundle)")
        files[name] = p.read_bytes()
    return files


# ---------------------------------------------------------------- verifying


@dataclass(frozen=True)
class Manifest:
    bundle_id: str
    created_at: str
    files: Mapping[str, str]
    key_id: str


def verify_bundle_files(files: Mapping[str, bytes], public_key: Ed25519PublicKey) -> Manifest:
    """Check signature and hashes; raise :class:`BundleError` naming the file.

    Order matters: nothing from the manifest is trusted before its signature
    verifies against the pinned key.
    """
    for name in BUNDLE_FILES:
        if name not in files:
            raise BundleError(f"{name}: missing from the bundle (unsigned or incomplete bundle)")
    try:
        sig = json.loads(files[SIGNATURE])
        raw_sig = base64.b64decode(sig["signature"], validate=True)
        recorded_manifest_hash = str(sig["manifest_sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{SIGNATURE}: malformed signature file ({exc})") from exc
    if _sha256(files[MANIFEST]) != recorded_manifest_hash:
        raise BundleError(f"{MANIFEST}: content does not match the hash recorded in {SIGNATURE} (tampered manifest)")
    try:
        public_key.verify(raw_sig, files[MANIFEST])
    except InvalidSignature:
        raise BundleError(
            f"{SIGNATURE}: Ed25519 signature does not verify with the pinned key {key_id(public_key)} "
            "(tampered signature, or signed by another key)"
        ) from None
    try:
        manifest = json.loads(files[MANIFEST])
        hashes = dict(manifest["files"])
        m = Manifest(
            bundle_id=str(manifest["bundle_id"]),
            created_at=str(manifest["created_at"]),
            files=hashes,
            key_id=str(manifest["key_id"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{MANIFEST}: malformed manifest ({exc})") from exc
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{MANIFEST}: expected format {FORMAT!r}, received {manifest.get('format')!r}")
    for name in (PROJECTOR, METADATA):
        if name not in hashes:
            raise BundleError(f"{MANIFEST}: does not list {name}")
        if _sha256(files[name]) != hashes[name]:
            raise BundleError(f"{name}: SHA-256 does not match the signed manifest (tampered or corrupted file)")
    expected_id = "eb-" + _sha256(_canonical_json({k: hashes[k] for k in (PROJECTOR, METADATA)}))[:20]
    if m.bundle_id != expected_id:
        raise BundleError(f"{MANIFEST}: bundle_id {m.bundle_id!r} does not match its content ({expected_id!r})")
    return m


def verify_bundle(bundle_dir: str | os.PathLike[str], public_key: Ed25519PublicKey) -> Manifest:
    """Verify a bundle directory (see :func:`verify_bundle_files`)."""
    return verify_bundle_files(read_bundle_files(bundle_dir), public_key)


# ------------------------------------------------------------------ loading


class ProjectionBundle:
    """A verified bundle ready to project faces with onnxruntime (any projection, eigenfaces by default).

    Use :meth:`load` (directory) or :meth:`from_files` (bytes received over
    gRPC/MQTT); both verify before parsing.

    Attributes
    ----------
    bundle_id : str
    projection_kind : str
        The projection its projector computes (``"eigenfaces"`` for bundles
        built before projections had kinds).
    outputs : tuple of str
        The projector's outputs: ``coefficients``, then the release domains it bounds into.
    geometry : FaceGeometry
    bounds : BundleBounds
    n_components : int
    metadata : dict
    files : dict of str to bytes
        The verified files (for re-serving the exact bundle).
    """

    def __init__(self, files: Mapping[str, bytes], manifest: Manifest, *, intra_op_threads: int = 1) -> None:
        self.files = dict(files)
        self.manifest = manifest
        self.bundle_id = manifest.bundle_id
        try:
            self.metadata: dict[str, Any] = json.loads(files[METADATA])
            self.geometry = FaceGeometry.from_dict(self.metadata["geometry"])
            self.bounds = BundleBounds.from_dict(self.metadata["bounds"])
            self.n_components = int(self.metadata["n_components"])
            self.n_features = int(self.metadata["n_features"])
            self.projection_kind = str(self.metadata.get("projection", LEGACY_PROJECTION))
            self.input: dict[str, Any] = dict(self.metadata.get("input", {"kind": "pixels"}))
            self.input_kind = str(self.input["kind"])
        except (ValueError, KeyError, TypeError) as exc:
            raise BundleError(f"{METADATA}: inconsistent metadata ({exc})") from exc
        if self.input_kind == "pixels" and self.n_features != self.geometry.n_pixels:
            raise BundleError(f"{METADATA}: n_features {self.n_features} does not match geometry {self.geometry.shape}")
        if self.input_kind != "pixels" and self.n_features != int(self.input.get("dimension", -1)):
            raise BundleError(
                f"{METADATA}: n_features {self.n_features} does not match the {self.input_kind} descriptor's "
                f"dimension {self.input.get('dimension')!r}"
            )
        opts = ort.SessionOptions()
        # One thread: a template is a tiny matmul, thread hand-off costs more
        # than it saves, and the Pi's other core stays free for capture.
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(
                files[PROJECTOR], sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise BundleError(f"{PROJECTOR}: onnxruntime could not load the projector ({exc})") from exc
        from peep.core.domains import COEFFICIENTS, DOMAINS

        shapes = {o.name: o.shape for o in self._session.get_outputs()}
        names = tuple(shapes)
        if (
            not names
            or names[0] != COEFFICIENTS
            or any(n not in DOMAINS for n in names[1:])
            or any(s[-1] != self.n_components for s in shapes.values())
        ):
            raise BundleError(
                f"{PROJECTOR}: expected outputs {COEFFICIENTS!r} then release domains among {list(DOMAINS)}, "
                f"each with metadata n_components {self.n_components}; received {shapes}"
            )
        self.outputs: tuple[str, ...] = names

    @classmethod
    def from_files(cls, files: Mapping[str, bytes], public_key: Ed25519PublicKey) -> ProjectionBundle:
        return cls(files, verify_bundle_files(files, public_key))

    @classmethod
    def load(cls, bundle_dir: str | os.PathLike[str], public_key: Ed25519PublicKey) -> ProjectionBundle:
        return cls.from_files(read_bundle_files(bundle_dir), public_key)

    @property
    def mechanism_defaults(self) -> dict[str, Any]:
        return dict(self.metadata.get("mechanism_defaults", {}))

    @property
    def normalisation(self) -> dict[str, Any]:
        return dict(self.metadata.get("normalisation", {}))

    def project(self, faces: ArrayLike, output: str | None = None) -> Any:
        """Run the projector.

        Parameters
        ----------
        faces : array-like of shape (n, height, width) or (n, n_pixels) or (height, width)
            Normalised faces in [0, 1] (see :func:`peep.core.imaging.normalise_face`);
            for a descriptor bundle (:attr:`input_kind` not ``"pixels"``),
            descriptors of shape (n, dimension) or (dimension,).
        output : str, optional
            One of :attr:`outputs`; all of them (as a dict) when omitted.

        Returns
        -------
        ndarray of shape (n, n_components), float32, or dict of them
        """
        arr = np.asarray(faces, dtype=np.float32)
        if self.input_kind != "pixels":
            if arr.ndim == 1:
                arr = arr.reshape(1, -1)
        elif arr.ndim == 2 and arr.shape == self.geometry.shape:
            arr = arr.reshape(1, -1)
        elif arr.ndim == 3:
            arr = arr.reshape(arr.shape[0], -1)
        if arr.ndim != 2 or arr.shape[1] != self.n_features:
            raise ValueError(
                f"faces: expected shape (n, {self.n_features}) or (n, {self.geometry.height}, "
                f"{self.geometry.width}), received {np.shape(faces)}"
            )
        if output is not None:
            if output not in self.outputs:
                raise ValueError(
                    f"output: expected one of {list(self.outputs)} (bundle {self.bundle_id}), received {output!r}"
                )
            return self._session.run([output], {"faces": arr})[0]
        return dict(zip(self.outputs, self._session.run(list(self.outputs), {"faces": arr}), strict=True))

    def check_mechanism(self, kind: str) -> None:
        """Raise :class:`BundleError` unless this bundle's projector outputs the domain mechanism ``kind`` releases.

        A mechanism made for another projection's output (e.g. a unit-sphere
        mechanism with an eigenface bundle) is refused with both named.
        """
        from peep.core.mechanisms import mechanism_class

        dom = mechanism_class(kind).domain
        if dom not in self.outputs:
            raise BundleError(
                f"mechanism {kind!r} releases the {dom!r} output, which bundle {self.bundle_id} "
                f"(projection {self.projection_kind!r}) does not have; its outputs are {list(self.outputs[1:])}"
            )

    def projection(self) -> Projection:
        """The fitted projection read back from the projector (its arrays as numpy)."""
        import onnx
        from onnx import numpy_helper
        from peep.core.projections import projection_class

        graph = onnx.load_from_string(self.files[PROJECTOR]).graph
        arrays: dict[str, NDArray[Any]] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        try:
            cls = projection_class(self.projection_kind)
        except ValueError as exc:
            raise BundleError(f"{METADATA}: {exc}") from None
        return cls.from_arrays(arrays, self.metadata)

    def model(self) -> EigenfaceModel:
        """The eigenfaces as a numpy :class:`EigenfaceModel` (``eigenfaces`` bundles only)."""
        projection = self.projection()
        model = getattr(projection, "model_", None)
        if model is None:
            raise BundleError(f"bundle {self.bundle_id}: projection {self.projection_kind!r} has no eigenface model")
        return model  # type: ignore[no-any-return]
