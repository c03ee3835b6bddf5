"""Face datasets: LFW through scikit-learn, or any folder-per-identity directory.

Two normalisations:

``"detector"`` (default)
    Faces found by the same detector and cropped by the same
    :func:`peep.core.imaging.normalise_face` path the edge agent uses, so a
    bundle and a recogniser built from a dataset see faces exactly as a
    device will.
``"lfw-crop"``
    scikit-learn's fixed LFW crop (``fetch_lfw_people`` defaults), as in the
    PEEP paper; for comparisons with its figures. Only for ``lfw``.

Each image is read, searched for a face and cropped (and, with an encoder,
described) once, in worker processes, and every result is cached keyed by
the image file's *content* (:mod:`peep.server.facework`,
:mod:`peep.server.facecache`): repeated runs, other selections of people and
other folders holding the same files cost a lookup, not a detection pass.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from peep.core.imaging import (
    DEFAULT_GEOMETRY,
    LFW_FIXED_GEOMETRY,
    FaceDetector,
    FaceGeometry,
    HaarFaceDetector,
)
from peep.server.facecache import FaceCache
from peep.server.facework import detector_description, process_files

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".pgm")
Normalisation = Literal["detector", "lfw-crop"]


class DatasetError(ValueError):
    """A dataset is missing, empty, unreadable or too small (names the path)."""


@dataclass
class FaceDataset:
    """Normalised faces with identity labels.

    Attributes
    ----------
    images : ndarray of shape (n_images, height, width), float32 in [0, 1]
    labels : ndarray of shape (n_images,), int
        Index into ``target_names``.
    target_names : list of str
    paths : list of str
        Source file of each image (empty for scikit-learn's cached LFW arrays).
    source : str
        ``"lfw"`` or the folder path.
    normalisation : dict
        How faces were found and cropped (goes into bundle metadata).
    n_skipped : int
        Images dropped because no face was detected or they could not be read.
    descriptors : ndarray of shape (n_images, dimension) or None
        Face descriptors of the same images (same detection, same order) when
        an encoder was given to :func:`load_dataset`, else None.
    """

    images: NDArray[np.float32]
    labels: NDArray[np.int64]
    target_names: list[str]
    source: str
    normalisation: dict[str, Any]
    paths: list[str] = field(default_factory=list)
    n_skipped: int = 0
    descriptors: NDArray[np.float32] | None = None

    @property
    def n_images(self) -> int:
        return int(self.images.shape[0])

    @property
    def n_subjects(self) -> int:
        return len(self.target_names)

    @property
    def X(self) -> NDArray[np.float32]:
        """Flattened faces, shape (n_images, height * width)."""
        return self.images.reshape(self.images.shape[0], -1)

    def subset(self, mask: NDArray[np.bool_]) -> FaceDataset:
        """Images where ``mask`` holds, labels re-indexed to the subjects kept."""
        kept = np.unique(self.labels[mask])
        remap = {int(old): new for new, old in enumerate(kept)}
        return FaceDataset(
            images=self.images[mask],
            labels=np.array([remap[int(v)] for v in self.labels[mask]], dtype=np.int64),
            target_names=[self.target_names[int(i)] for i in kept],
            source=self.source,
            normalisation=self.normalisation,
            paths=[p for p, m in zip(self.paths, mask, strict=False) if m] if self.paths else [],
            n_skipped=self.n_skipped,
            descriptors=None if self.descriptors is None else self.descriptors[mask],
        )

    def inputs(self, kind: str) -> NDArray[np.float32]:
        """What a projection with input ``kind`` takes: flattened faces (``"pixels"``) or the descriptors."""
        if kind == "pixels":
            return self.X
        if self.descriptors is None:
            raise DatasetError(f"dataset: expected {kind} descriptors (load it with their encoder), it has none")
        return self.descriptors


def resolve_data_home(data_home: str | os.PathLike[str] | None) -> str | None:
    """``--data-home``, then ``SCIKIT_LEARN_DATA``, then scikit-learn's default."""
    if data_home:
        return str(data_home)
    return os.environ.get("SCIKIT_LEARN_DATA") or None


#: The folder of LFW's one-image people (``../shared/datasets/lfw_singles``): public people no model sees.
SINGLES_FOLDER = "lfw_singles"


def singles_folder(data_home: str | os.PathLike[str] | None = None) -> Path | None:
    """The folder of LFW's one-image people, found as ``scripts/stage-lfw.sh`` finds the LFW copy; None if absent.

    Looked for as ``lfw_singles/`` in the data home (``--data-home``, ``SCIKIT_LEARN_DATA``, scikit-learn's
    default; ``stage-lfw.sh`` links it there beside ``lfw_home/``), then in ``$PEEP_DATASETS``. A folder
    counts only if it holds per-person folders.
    """
    from sklearn.datasets import get_data_home

    candidates = [Path(get_data_home(resolve_data_home(data_home))) / SINGLES_FOLDER]
    if os.environ.get("PEEP_DATASETS"):
        candidates.append(Path(os.environ["PEEP_DATASETS"]) / SINGLES_FOLDER)
    for c in candidates:
        try:
            if c.is_dir() and any(p.is_dir() for p in c.iterdir()):
                return c.resolve()
        except OSError:
            continue
    return None


def _lfw_folder(data_home: str | None) -> Path:
    from sklearn.datasets import get_data_home

    return Path(get_data_home(data_home)) / "lfw_home" / "lfw_funneled"


def ensure_lfw(data_home: str | os.PathLike[str] | None = None) -> Path:
    """The ``lfw_funneled`` folder under the data home, downloaded by scikit-learn if missing.

    Raises :class:`DatasetError` (naming ``--data-home``) when it is missing
    and cannot be downloaded (e.g. no network).
    """
    return _ensure_lfw(resolve_data_home(data_home))


def _ensure_lfw(data_home: str | None) -> Path:
    folder = _lfw_folder(data_home)
    if folder.is_dir():
        return folder
    from sklearn.datasets import fetch_lfw_people

    log.info("LFW not found under %s; asking scikit-learn to download it", folder)
    try:
        fetch_lfw_people(data_home=data_home, min_faces_per_person=0, download_if_missing=True)
    except Exception as exc:  # URLError, OSError, ... from the downloader
        raise DatasetError(
            f"--dataset lfw: not found under {folder} and the download failed ({exc}); "
            "pass --data-home (or set SCIKIT_LEARN_DATA) to a folder holding lfw_home/"
        ) from exc
    return folder


def _list_folder(
    root: Path, min_faces: int, max_faces: int | None = None, people: Collection[str] | None = None
) -> tuple[list[str], list[list[Path]]]:
    if not root.is_dir():
        raise DatasetError(f"--dataset {root}: expected a folder of per-identity folders, it does not exist")
    names: list[str] = []
    files: list[list[Path]] = []
    wanted = None if people is None else {n.replace(" ", "_") for n in people}
    for person in sorted(p for p in root.iterdir() if p.is_dir()):
        if wanted is not None and person.name not in wanted:
            continue
        imgs = sorted(f for f in person.iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file())
        if imgs and len(imgs) >= min_faces and (max_faces is None or len(imgs) <= max_faces):
            names.append(person.name)
            files.append(imgs)
    if not names:
        limit = f" and at most {max_faces}" if max_faces is not None else ""
        among = f" among the {len(wanted)} people asked for" if wanted is not None else ""
        raise DatasetError(
            f"--dataset {root}: no identity folder with at least {min_faces}{limit} images{among} "
            f"({', '.join(IMAGE_EXTENSIONS)})"
        )
    return names, files


def cache_dir(data_home: str | None) -> Path | None:
    """The cache folder: ``PEEP_CACHE_DIR``, else ``<data home>/peep_cache``, else ``~/.cache/peep``.

    None when it cannot be created or written (everything is computed anew).
    """
    base = os.environ.get("PEEP_CACHE_DIR") or (str(Path(data_home) / "peep_cache") if data_home else None)
    if base is None:
        base = str(Path.home() / ".cache" / "peep")
    p = Path(base)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return p if os.access(p, os.W_OK) else None


def load_dataset(
    dataset: str,
    *,
    data_home: str | os.PathLike[str] | None = None,
    min_faces: int = 20,
    max_faces: int | None = None,
    normalisation: Normalisation = "detector",
    geometry: FaceGeometry | None = None,
    detector: FaceDetector | None = None,
    max_per_subject: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    encoder: Any = None,
    jobs: int | None = None,
    people: Collection[str] | None = None,
) -> FaceDataset:
    """Load ``"lfw"`` or a folder-per-identity directory as normalised faces.

    Parameters
    ----------
    dataset : str
        ``"lfw"`` or a path.
    min_faces : int, default=20
        Keep identities with at least this many usable images (counted after
        detection for the detector path).
    max_faces : int, optional
        Keep only identities with at most this many image files (e.g. LFW's
        5-9 image people as a background population disjoint from the
        enrolled ones).
    normalisation : {"detector", "lfw-crop"}
    geometry : FaceGeometry, optional
        Output geometry; defaults to 47x62 (``LFW_FIXED_GEOMETRY`` for lfw-crop).
    detector : FaceDetector, optional
        Defaults to :class:`HaarFaceDetector`.
    max_per_subject : int, optional
        Cap images per identity (first ones in file order), e.g. to balance.
    progress : callable, optional
        ``progress(done, total)`` over the images not found in the cache, as
        they are computed (see :func:`peep.server.facework.process_files`).
    encoder : DescriptorEncoder, optional
        Also compute each face's descriptor (e.g.
        :class:`peep.edge.embedding.DlibResNetEncoder`), from the same
        detection.
    jobs : int, optional
        Worker processes computing what is not cached (None: one per core;
        1: in this process).
    people : collection of str, optional
        Keep only these identities (folder names; ``_`` or spaces), before
        anything is read: the others' images are neither detected nor
        described.

    Faces and descriptors are cached per image, keyed by the image file's
    content (:mod:`peep.server.facecache`): any selection of people, in any
    folder holding the same files, reuses them.
    """
    home = resolve_data_home(data_home)
    if min_faces < 1:
        raise DatasetError(f"--min-faces: expected >= 1, received {min_faces}")
    if normalisation not in ("detector", "lfw-crop"):
        raise DatasetError(f"normalisation: expected 'detector' or 'lfw-crop', received {normalisation!r}")
    if dataset == "lfw":
        root = _ensure_lfw(home)
        source = "lfw"
    else:
        root = Path(dataset)
        source = str(root)
        if normalisation == "lfw-crop":
            raise DatasetError("normalisation 'lfw-crop' applies to --dataset lfw only (a folder has no fixed crop)")
    if max_faces is not None and max_faces < min_faces:
        raise DatasetError(f"--max-faces: expected >= --min-faces ({min_faces}), received {max_faces}")
    names, per_person = _list_folder(root, min_faces, max_faces, people)
    if max_per_subject is not None:
        per_person = [imgs[:max_per_subject] for imgs in per_person]
    fixed = normalisation == "lfw-crop"
    geom = geometry or (LFW_FIXED_GEOMETRY if fixed else DEFAULT_GEOMETRY)
    det: FaceDetector | None = None if fixed else (detector or HaarFaceDetector())
    files = [f for imgs in per_person for f in imgs]
    labels_all = np.concatenate([np.full(len(imgs), i, dtype=np.int64) for i, imgs in enumerate(per_person)])
    norm_desc: dict[str, Any] = {"method": normalisation, "geometry": geom.to_dict()}
    norm_desc.update({"box": "lfw-fixed"} if fixed else detector_description(det))

    if jobs is not None and jobs < 1:
        raise DatasetError(f"jobs: expected >= 1 or None (one per core), received {jobs}")
    folder = cache_dir(home)
    cache = FaceCache(folder) if folder is not None else None
    try:
        found = process_files(
            files, geometry=geom, detector=det, encoder=encoder, cache=cache, jobs=jobs, progress=progress
        )
    finally:
        if cache is not None:
            cache.close()
    faces, ok, descriptors = found.faces, found.ok, found.descriptors
    labels = labels_all[ok]
    kept_paths = [str(f) for f, good in zip(files, ok, strict=True) if good]
    counts = np.bincount(labels, minlength=len(names))
    keep_subjects = np.flatnonzero(counts >= min_faces)
    if keep_subjects.size == 0:
        raise DatasetError(
            f"--dataset {dataset}: no identity has {min_faces} images with a detected face "
            f"({int((~ok).sum())} of {len(files)} images had none)"
        )
    mask = np.isin(labels, keep_subjects)
    ds = FaceDataset(
        images=faces.astype(np.float32),
        labels=labels,
        target_names=[n.replace("_", " ") for n in names],
        source=source,
        normalisation=norm_desc,
        paths=kept_paths,
        n_skipped=int((~ok).sum()),
        descriptors=descriptors,
    )
    return ds.subset(mask) if not mask.all() or keep_subjects.size != len(names) else ds


def load_lfw_sklearn(*, data_home: str | None = None, min_faces: int = 100) -> FaceDataset:
    """LFW exactly as ``fetch_lfw_people`` returns it (fixed crop, resize 0.5 -> 62x47)."""
    from sklearn.datasets import fetch_lfw_people

    home = resolve_data_home(data_home)
    try:
        lfw = fetch_lfw_people(data_home=home, min_faces_per_person=min_faces, download_if_missing=True)
    except Exception as exc:
        raise DatasetError(
            f"--dataset lfw: scikit-learn could not load LFW from {home or 'its default home'} ({exc})"
        ) from exc
    return FaceDataset(
        images=lfw.images.astype(np.float32),
        labels=lfw.target.astype(np.int64),
        target_names=[str(n) for n in lfw.target_names],
        source="lfw",
        normalisation={"method": "sklearn-fetch_lfw_people", "resize": 0.5},
    )
