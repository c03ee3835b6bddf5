"""The calibration set of device models: clean, unkeyed projections of public faces the model never saw.

A device deciding on its own clean projection sets its thresholds on the model's scores of faces the model
was never trained on (:func:`peep.core.decision.calibrate_clean`): a model trained on noisy releases meets
clean queries of another scale, and the server, which never holds the site key, cannot score keyed clean
projections itself. So every signed device model carries public faces projected exactly as a device projects
its own: the same detector and normalisation (:func:`peep.server.datasets.load_dataset`, the path the
bundles and the demo use), the bundle's projector, the bounded output of the mechanism's domain -- and no
noise, no site key (the device rotates them with its own).

``peep bundle calibrate`` writes the set once per bundle (:func:`make_calibration`); the server reads it at
start (``training.device_models.calibration``, :func:`load_calibration`) and refuses, when it issues a model,
a set with a face of a person the model was trained on (:meth:`CalibrationSet.overlap`): their scores would
be those of an enrolled person, not a stranger's. The file (``.npz``, no pickles) holds:

``projections``
    float32, shape (n, nc): the bounded projections.
``people``
    str, shape (n,): the person tag of each row (the dataset's folder name, e.g. ``Aaron_Eckhart``); a person
    enrolled in the server's background class as ``background:<tag>`` must not be among them.
``bundle_id``, ``domain``, ``mechanism``
    str: the bundle that projected them, and the domain (and the mechanism kind that named it) of its output.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

__all__ = ["CalibrationError", "CalibrationSet", "load_calibration", "make_calibration", "write_calibration"]

#: Most faces a calibration set holds: 20,000 faces of nc = 128 are 10 MB, well inside a device model.
MAX_FACES: Final = 20_000
#: Largest calibration file read.
MAX_FILE_BYTES: Final = 64 * 1024 * 1024
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.:@'-]{0,127}$")
_KEYS: Final = ("projections", "people", "bundle_id", "domain", "mechanism")


class CalibrationError(ValueError):
    """A calibration set is unreadable, malformed or not fit for the model (the message names the field)."""


@dataclass(frozen=True)
class CalibrationSet:
    """A read and checked calibration file (see the module docstring).

    Attributes
    ----------
    projections : ndarray of float32, shape (n, n_components)
    people : tuple of str
        One tag per row.
    bundle_id, domain, mechanism : str
    sha256 : str
        Of the file's bytes: which set a device model carries (the console shows its first 16 digits).
    source : str
        Where it was read from.
    """

    projections: NDArray[np.float32] = field(repr=False)
    people: tuple[str, ...] = field(repr=False)
    bundle_id: str
    domain: str
    mechanism: str
    sha256: str
    source: str = ""

    @property
    def n_faces(self) -> int:
        return int(self.projections.shape[0])

    @property
    def n_people(self) -> int:
        return len(set(self.people))

    @property
    def groups(self) -> list[int]:
        """The person of each row as an index (what a device model carries instead of the tags)."""
        index: dict[str, int] = {}
        return [index.setdefault(p, len(index)) for p in self.people]

    @property
    def n_components(self) -> int:
        return int(self.projections.shape[1])

    def overlap(self, subjects: Iterable[str], background_prefix: str) -> list[str]:
        """The calibration people a model was trained on, sorted: background subjects by tag, others by name.

        Parameters
        ----------
        subjects : iterable of str
            The model's classes.
        background_prefix : str
            ``training.background_prefix``: ``background:<tag>`` is the person tagged ``<tag>``.
        """
        tags = set(self.people)
        trained = set()
        for s in subjects:
            if background_prefix and s.startswith(background_prefix):
                trained.add(s[len(background_prefix) :])
            elif s:
                trained.add(s)
        # The same person may be spelt with spaces or underscores (LFW's folder names use underscores).
        norm = {t.replace(" ", "_"): t for t in tags}
        return sorted(norm[t] for t in norm if t in {x.replace(" ", "_") for x in trained})

    def describe(self) -> dict[str, Any]:
        """What the console and the model status show about the set."""
        return {
            "faces": self.n_faces,
            "people": self.n_people,
            "bundle_id": self.bundle_id,
            "domain": self.domain,
            "mechanism": self.mechanism,
            "sha256": self.sha256,
            "source": self.source,
        }


def _text(data: Any, key: str) -> str:
    value = data[key]
    if value.ndim != 0 or value.dtype.kind != "U":
        raise CalibrationError(f"{key}: expected one string, received an array of {value.dtype} {value.shape}")
    return str(value)


def read_calibration(payload: bytes, *, source: str = "") -> CalibrationSet:
    """Parse and check a calibration file's bytes (:class:`CalibrationError` naming the field)."""
    if len(payload) > MAX_FILE_BYTES:
        raise CalibrationError(f"calibration: expected at most {MAX_FILE_BYTES} bytes, received {len(payload)}")
    try:
        data = np.load(io.BytesIO(payload), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CalibrationError(
            f"calibration: expected a .npz written by peep bundle calibrate, received {source or 'bytes'} "
            f"({str(exc)[:120]})"
        ) from None
    with data:
        if not hasattr(data, "files"):
            raise CalibrationError("calibration: expected a .npz archive, received a single array")
        missing = [k for k in _KEYS if k not in data.files]
        if missing:
            raise CalibrationError(f"{missing[0]}: missing from the calibration file (peep bundle calibrate writes it)")
        try:
            proj = data["projections"]
            people = data["people"]
        except ValueError as exc:  # an object array, which would need pickle
            raise CalibrationError(f"calibration: expected plain arrays, received {str(exc)[:120]}") from None
        bundle_id, domain, mechanism = _text(data, "bundle_id"), _text(data, "domain"), _text(data, "mechanism")
    if proj.dtype != np.float32 or proj.ndim != 2 or not 1 <= proj.shape[0] <= MAX_FACES or proj.shape[1] < 1:
        raise CalibrationError(
            f"projections: expected float32 of shape (1..{MAX_FACES}, nc), received {proj.dtype} {proj.shape}"
        )
    if not np.all(np.isfinite(proj)):
        raise CalibrationError("projections: expected finite values, received NaN or infinity")
    if people.dtype.kind != "U" or people.shape != (proj.shape[0],):
        raise CalibrationError(
            f"people: expected {proj.shape[0]} person tags (one per projection), received {people.dtype} {people.shape}"
        )
    tags = tuple(str(t) for t in people)
    bad = next((t for t in tags if not _TAG.match(t)), None)
    if bad is not None:
        raise CalibrationError(f"people: expected person tags such as folder names, received {bad[:64]!r}")
    from peep.core.domains import DOMAINS
    from peep.core.wire import ID_PATTERN

    if not ID_PATTERN.match(bundle_id):
        raise CalibrationError(f"bundle_id: expected a bundle id, received {bundle_id[:64]!r}")
    if domain not in DOMAINS:
        raise CalibrationError(f"domain: expected one of {', '.join(DOMAINS)}, received {domain[:64]!r}")
    return CalibrationSet(
        projections=np.ascontiguousarray(proj),
        people=tags,
        bundle_id=bundle_id,
        domain=domain,
        mechanism=mechanism[:64],
        sha256=hashlib.sha256(payload).hexdigest(),
        source=source,
    )


def load_calibration(path: str | os.PathLike[str]) -> CalibrationSet:
    """Read and check the calibration file at ``path`` (:class:`CalibrationError` naming the file)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise CalibrationError(f"calibration: expected at most {MAX_FILE_BYTES} bytes, {p} has {size}")
        payload = p.read_bytes()
    except OSError as exc:
        raise CalibrationError(f"calibration: expected a readable file, received {str(p)!r} ({exc.strerror})") from None
    return read_calibration(payload, source=str(p))


def write_calibration(
    path: str | os.PathLike[str],
    *,
    projections: NDArray[np.float32],
    people: Sequence[str],
    bundle_id: str,
    domain: str,
    mechanism: str,
) -> CalibrationSet:
    """Write a calibration file (atomically: a temporary file renamed) and return it as read back."""
    buf = io.BytesIO()
    np.savez(
        buf,
        projections=np.ascontiguousarray(projections, dtype=np.float32),
        people=np.array(list(people), dtype=str),
        bundle_id=np.array(bundle_id),
        domain=np.array(domain),
        mechanism=np.array(mechanism),
    )
    payload = buf.getvalue()
    checked = read_calibration(payload, source=str(path))  # never write what the server would refuse
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, p)
    return checked


def make_calibration(
    bundle: Any,
    dataset: str,
    *,
    mechanism: str | None = None,
    data_home: str | None = None,
    min_faces: int = 1,
    max_faces: int | None = None,
    people: Collection[str] | None = None,
    exclude: Collection[str] = (),
    max_per_person: int | None = None,
    progress: Any = None,
) -> tuple[NDArray[np.float32], list[str], str, str]:
    """Project public faces with ``bundle`` exactly as a device does: ``(projections, people, domain, kind)``.

    Parameters
    ----------
    bundle : ProjectionBundle
        A verified bundle.
    dataset : str
        ``"lfw"`` or a folder-per-identity directory.
    mechanism : str, optional
        The mechanism kind whose domain the projections are bounded into (default: the bundle's
        ``mechanism_defaults``); it must be the domain the server's model is trained on.
    people : collection of str, optional
        Only these people (folder names).
    exclude : collection of str
        Never these people: the server's background population and anyone enrolled.
    max_per_person : int, optional
        At most this many faces of one person (a few people with many photos would otherwise dominate).

    Raises
    ------
    CalibrationError
        No usable face, an unknown mechanism, or a projector without the mechanism's domain.
    """
    from peep.core.mechanisms import mechanism_class
    from peep.server.datasets import load_dataset

    kind = mechanism or str(bundle.mechanism_defaults.get("kind", ""))
    try:
        domain = mechanism_class(kind).domain
        bundle.check_mechanism(kind)
    except (ValueError, TypeError) as exc:
        raise CalibrationError(f"--mechanism: {exc}") from None
    encoder: Any = None
    if bundle.input_kind != "pixels":
        from peep.server.descriptors import descriptor_encoder

        encoder = descriptor_encoder(bundle.input_kind, option="--bundle")
    excluded = {e.replace(" ", "_") for e in exclude}
    wanted = None if people is None else [p for p in people if p.replace(" ", "_") not in excluded]
    ds = load_dataset(
        dataset,
        data_home=data_home,
        min_faces=min_faces,
        max_faces=max_faces,
        geometry=bundle.geometry,
        max_per_subject=max_per_person,
        progress=progress,
        encoder=encoder,
        people=wanted,
    )
    names = [n.replace(" ", "_") for n in ds.target_names]
    keep = np.array([names[int(k)] not in excluded for k in ds.labels], dtype=bool)
    if not keep.any():
        raise CalibrationError("--exclude: every face of the dataset belongs to an excluded person")
    ds = ds.subset(keep) if not keep.all() else ds
    if ds.n_images > MAX_FACES:
        raise CalibrationError(
            f"--dataset: expected at most {MAX_FACES} faces, found {ds.n_images} (use --max-per-person, "
            "--max-faces or --people-from)"
        )
    proj = np.asarray(bundle.project(ds.inputs(bundle.input_kind), domain), dtype=np.float32)
    tags = [ds.target_names[int(k)].replace(" ", "_") for k in ds.labels]
    return proj, tags, domain, kind
