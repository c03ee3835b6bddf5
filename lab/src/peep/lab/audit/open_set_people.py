"""Who is who in ``peep audit --open-set``: the people of each split and the population they come from.

The rule is :mod:`peep.lab.audit.open_set`'s (its docstring states it): enrolled people, the two stranger
populations, the background class, the calibration people and, with the singles, the public people left
out. This module draws them (:func:`partition_people`) and loads the faces they are drawn from
(:func:`load_population`); the rest of the section releases, fits and decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.projections import projection_class
from peep.lab.audit import execution
from peep.lab.audit.config import AuditConfig, AuditConfigError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: The groups of people of one split, in report order (``single_strangers`` and ``unused`` are empty
#: unless the singles calibrate).
GROUPS = ("enrolled", "strangers", "single_strangers", "background", "calibration", "unused")
#: Strangers are LFW people with this many images (the never-enrolled range of the staged subset).
STRANGER_IMAGES = (5, 9)
#: Singles drawn beyond the calibration people and single strangers asked for, so that a face the detector
#: misses leaves the groups their sizes: this share, plus ten.
_SINGLES_MARGIN = 0.03
# Seed streams: the people partition, the singles' pool (open_set's releases use 1_002 and 1_003).
PARTITION_STREAM, _SINGLES_STREAM = 1_001, 1_004


# --------------------------------------------------------------------------- the people


@dataclass(frozen=True)
class OpenSetPeople:
    """One split's people: identity labels of each group and the population rows each uses.

    Attributes
    ----------
    people : dict of str to ndarray of int
        Identity labels of each of :data:`GROUPS`.
    enrol_rows, probe_rows : ndarray of int, shape (enrolled · enrol_images,), (enrolled · probes,)
    stranger_rows : ndarray of int, shape (strangers,)
        One capture per stranger (LFW people with 5 to 9 images).
    single_stranger_rows : ndarray of int, shape (single strangers,)
        The one photo of each stranger drawn from the singles (empty unless the singles calibrate).
    background_rows : ndarray of int
        At most ``open_set_public_max_images`` rows per background person (their releases: the model's
        "unknown" class).
    calibration_rows : ndarray of int
        Every row of each calibration person (at most ``open_set_calibration_images`` when that is set; one
        for a single): their clean projections set the device's thresholds, each person weighing alike.
    basis_rows : ndarray of int
        At most ``open_set_public_max_images`` rows of every public person (background and calibration
        alike): the faces the projection is fitted on, the same whatever the division of the public people.
    """

    people: dict[str, IntArray]
    enrol_rows: IntArray
    probe_rows: IntArray
    stranger_rows: IntArray
    background_rows: IntArray
    calibration_rows: IntArray
    basis_rows: IntArray
    single_stranger_rows: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def public_rows(self) -> IntArray:
        """The faces the projection is fitted on (:attr:`basis_rows`), shape (n_basis,)."""
        return self.basis_rows


def deal_share(persons: IntArray, n_images: IntArray, share: float, rng: np.random.Generator) -> NDArray[np.bool_]:
    """Which of ``persons`` go to a group taking ``share`` of them, alike in numbers of images.

    The people are ordered by their number of images (random order among equals) and taken by systematic
    sampling with a random start: of any run of ``m`` consecutive people about ``share · m`` are taken, so
    the group and the rest have alike numbers of photos. ``share`` 0 takes nobody, 1 everybody.

    Parameters
    ----------
    persons, n_images : ndarray of int, shape (n,)
        Identities and their numbers of images.
    share : float
        In [0, 1].
    rng : numpy.random.Generator
    """
    n = int(persons.size)
    order = np.lexsort((rng.permutation(n), np.asarray(n_images)))
    u = float(rng.random())
    i = np.arange(n, dtype=np.float64)
    taken_in_order = np.floor((i + 1.0) * share + u) > np.floor(i * share + u)
    taken = np.zeros(n, dtype=bool)
    taken[order] = taken_in_order
    return taken


def partition_people(
    labels: NDArray[np.integer],
    cfg: AuditConfig,
    rng: np.random.Generator,
    singles: NDArray[np.integer] | None = None,
) -> OpenSetPeople:
    """Draw one split's enrolled people, strangers, background and calibration people.

    Parameters
    ----------
    labels : ndarray of int, shape (n_faces,)
        Identity of every face of the population (LFW people with at least 5 images, then the singles).
    cfg : AuditConfig
        ``open_set_enrolled``, ``open_set_enrol_images``, ``open_set_probes``, ``open_set_strangers``,
        ``open_set_public_max_images``, ``open_set_calibration_images``, ``open_set_background_rare``,
        ``open_set_background_frequent``, ``open_set_calibration_people``, ``open_set_single_strangers``.
    rng : numpy.random.Generator
        The split's partition stream.
    singles : ndarray of int, optional
        Identities of the population's one-image people (LFW's singles, one face each). Given, they are the
        calibration people and a second stranger population, dealt per split, and the public people with
        several images that the background class does not take are left out (``unused``). None or empty:
        the public people the background class does not take calibrate (the rule before the singles).

    Raises
    ------
    AuditConfigError
        Too few people for the numbers asked for (the message names the option).
    """
    y = np.asarray(labels, dtype=np.int64)
    single_ids = np.zeros(0, dtype=np.int64) if singles is None else np.unique(np.asarray(singles, dtype=np.int64))
    ids, counts = np.unique(y, return_counts=True)
    several = ~np.isin(ids, single_ids)
    ids, counts = ids[several], counts[several]
    need = cfg.open_set_enrol_images + cfg.open_set_probes
    frequent = ids[counts >= need]
    if frequent.size < cfg.open_set_enrolled:
        raise AuditConfigError(
            f"--open-set-enrolled: expected at most {frequent.size} (LFW people in the data home with at least "
            f"{need} images: {cfg.open_set_enrol_images} to enrol and {cfg.open_set_probes} probes), "
            f"received {cfg.open_set_enrolled}"
        )
    lo, hi = STRANGER_IMAGES
    rare = ids[(counts >= lo) & (counts <= hi)]
    if rare.size < cfg.open_set_strangers + 2:
        raise AuditConfigError(
            f"--open-set-strangers: expected at most {rare.size - 2} (LFW people with {lo}-{hi} images, leaving "
            f"two for the public), received {cfg.open_set_strangers}"
        )
    enrolled = np.sort(rng.choice(frequent, cfg.open_set_enrolled, replace=False))
    strangers = np.sort(rng.choice(rare, cfg.open_set_strangers, replace=False))
    enrol_rows, probe_rows = [], []
    for person in enrolled:
        rows = rng.permutation(np.flatnonzero(y == person))
        enrol_rows.append(rows[: cfg.open_set_enrol_images])
        probe_rows.append(rows[cfg.open_set_enrol_images : need])
    stranger_rows = np.array([rng.choice(np.flatnonzero(y == s)) for s in strangers], dtype=np.int64)
    # The public: everyone neither enrolled nor a stranger. The people of the strangers' own range (LFW's
    # 5-9 image people) and the frequently photographed ones not enrolled are each dealt by number of images,
    # a share of each to the background class (the model's "unknown"). Every other public person calibrates
    # the device's thresholds, unless the singles do: then they are left out, so that the model and its
    # thresholds are the same whichever stranger population is asked.
    with_singles = single_ids.size > 0
    n_of = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    rare_rest = rare[~np.isin(rare, strangers)]
    frequent_rest = ids[~np.isin(ids, np.concatenate([enrolled, rare]))]
    background: list[int] = []
    rest: list[int] = []
    for persons, share in (
        (rare_rest, cfg.open_set_background_rare),
        (frequent_rest, cfg.open_set_background_frequent),
    ):
        to_bg = deal_share(persons, np.array([n_of[int(p)] for p in persons], dtype=np.int64), share, rng)
        background += [int(p) for p in persons[to_bg]]
        rest += [int(p) for p in persons[~to_bg]]
    background.sort()
    rest.sort()
    calibration = [] if with_singles else rest
    bg_set = set(background)
    rows_of: dict[str, list[IntArray]] = {"background": [], "calibration": [], "basis": []}
    for person in sorted(background + calibration):
        rows = rng.permutation(np.flatnonzero(y == person))
        if person in bg_set or cfg.open_set_basis == "public":
            rows_of["basis"].append(rows[: cfg.open_set_public_max_images])
        if person in bg_set:
            rows_of["background"].append(rows[: cfg.open_set_public_max_images])
        else:
            rows_of["calibration"].append(rows[: cfg.open_set_calibration_images])
    single_strangers = np.zeros(0, dtype=np.int64)
    single_stranger_rows = np.zeros(0, dtype=np.int64)
    if with_singles:
        # Drawn last, so that the people above are the very ones the rule before the singles draws.
        n_s, n_c = cfg.open_set_single_strangers, cfg.open_set_calibration_people
        if single_ids.size < n_s + n_c:
            raise AuditConfigError(
                f"--open-set-calibration-people: expected at most {single_ids.size - n_s} (the {single_ids.size} "
                f"singles with a detected face, less --open-set-single-strangers {n_s}), received {n_c}"
            )
        dealt = rng.permutation(single_ids)
        single_strangers = np.sort(dealt[:n_s])
        calibration_singles = np.sort(dealt[n_s : n_s + n_c])
        at = np.flatnonzero(np.isin(y, single_ids))
        first_row = dict(zip(y[at].tolist(), at.tolist(), strict=True))
        single_stranger_rows = np.array([first_row[int(p)] for p in single_strangers], dtype=np.int64)
        cal_rows = np.array([first_row[int(p)] for p in calibration_singles], dtype=np.int64)
        rows_of["calibration"].append(cal_rows)
        if cfg.open_set_basis == "public":
            rows_of["basis"].append(cal_rows)
        calibration = [int(p) for p in calibration_singles]

    def _rows(parts: list[IntArray]) -> IntArray:
        return np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    return OpenSetPeople(
        people={
            "enrolled": enrolled.astype(np.int64),
            "strangers": strangers.astype(np.int64),
            "single_strangers": single_strangers,
            "background": np.array(background, dtype=np.int64),
            "calibration": np.array(calibration, dtype=np.int64),
            "unused": np.array(rest if with_singles else [], dtype=np.int64),
        },
        enrol_rows=np.concatenate(enrol_rows).astype(np.int64),
        probe_rows=np.concatenate(probe_rows).astype(np.int64),
        stranger_rows=stranger_rows,
        background_rows=_rows(rows_of["background"]),
        calibration_rows=_rows(rows_of["calibration"]),
        basis_rows=_rows(rows_of["basis"]),
        single_stranger_rows=single_stranger_rows,
    )


def person_weights(people: NDArray[np.integer]) -> FloatArray:
    """One over the number of faces of each face's person: every person weighs alike, shape (n_faces,)."""
    _, inverse, n = np.unique(np.asarray(people), return_inverse=True, return_counts=True)
    return 1.0 / n[inverse.ravel()].astype(np.float64)


@dataclass
class Population:
    """The LFW people the section draws from (at least 5 images each), then the singles' pool when they calibrate.

    Attributes
    ----------
    inputs : ndarray of shape (n_faces, input dimension)
        What the audited projection takes: flattened faces or descriptors.
    labels : ndarray of int, shape (n_faces,)
    names : list of str
    image_shape : tuple of int
        (height, width) of a face, for projections fitted on mirrored faces.
    singles : ndarray of int, shape (n_singles,)
        Identities (in ``labels``) of the one-image people drawn from ``lfw_singles/``: empty unless the
        singles calibrate.
    """

    inputs: NDArray[np.float32]
    labels: IntArray
    names: list[str]
    image_shape: tuple[int, int]
    description: dict[str, Any] = field(default_factory=dict)
    singles: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def resolve_calibration(cfg: AuditConfig) -> tuple[str, Any]:
    """Who calibrates (``"singles"`` or ``"public"``) and the singles' folder (None for ``"public"``).

    Raises
    ------
    AuditConfigError
        ``open_set_calibration="singles"`` and no ``lfw_singles/`` folder is found.
    """
    from peep.server.datasets import SINGLES_FOLDER, singles_folder

    if cfg.open_set_calibration == "public":
        return "public", None
    if cfg.normalisation == "lfw-crop":
        # LFW's fixed crop has no meaning for a folder: the singles would be normalised otherwise than the rest.
        if cfg.open_set_calibration == "singles":
            raise AuditConfigError(
                "--open-set-calibration: expected 'public' or 'auto' with --normalisation lfw-crop (the singles are "
                "a folder, normalised by the detector), received 'singles'"
            )
        return "public", None
    folder = singles_folder(cfg.data_home)
    if folder is None and cfg.open_set_calibration == "singles":
        raise AuditConfigError(
            f"--open-set-calibration: expected a {SINGLES_FOLDER}/ folder of one-image people in the data home or "
            "in $PEEP_DATASETS (scripts/stage-lfw.sh links it), found none; received 'singles' (pass 'public' "
            "for the rule before the singles)"
        )
    return ("public", None) if folder is None else ("singles", folder)


def _singles_pool(cfg: AuditConfig, folder: Any) -> list[str]:
    """The singles the section describes: enough for every split's calibration people and single strangers.

    Drawn once by the seed (every split deals the same pool anew), a margin over the numbers asked for
    covering faces the detector misses; describing all 4,069 would cost a fresh machine minutes for nothing.
    """
    names = sorted(p.name for p in folder.iterdir() if p.is_dir())
    want = cfg.open_set_calibration_people + cfg.open_set_single_strangers
    if want > len(names):
        raise AuditConfigError(
            f"--open-set-calibration-people: expected at most {len(names) - cfg.open_set_single_strangers} (the "
            f"{len(names)} singles in {folder}, less --open-set-single-strangers {cfg.open_set_single_strangers}), "
            f"received {cfg.open_set_calibration_people}"
        )
    n = min(len(names), want + int(np.ceil(_SINGLES_MARGIN * want)) + 10)
    pick = np.random.default_rng(np.random.SeedSequence([cfg.seed, _SINGLES_STREAM])).permutation(len(names))[:n]
    return sorted(names[int(i)] for i in pick)


def load_population(cfg: AuditConfig) -> Population:
    """Every LFW person in the data home with at least 5 images, then the singles' pool when they calibrate."""
    from peep.server.datasets import load_dataset
    from peep.server.descriptors import descriptor_encoder

    kind = projection_class(cfg.projection).input_kind
    encoder = None if kind == "pixels" else descriptor_encoder(kind)
    norm: Any = cfg.normalisation
    described = "" if encoder is None else f" and their {kind} descriptors"
    with execution.progress_bar(cfg, f"open set: LFW faces{described} (cached afterwards)") as cb:
        ds = load_dataset(
            "lfw",
            data_home=cfg.data_home,
            min_faces=STRANGER_IMAGES[0],
            normalisation=norm,
            progress=cb,
            encoder=encoder,
            jobs=cfg.jobs or None,
        )
    inputs = np.asarray(ds.X if encoder is None else ds.descriptors, dtype=np.float32)
    labels = np.asarray(ds.labels, dtype=np.int64)
    names = list(ds.target_names)
    source, folder = resolve_calibration(cfg)
    description: dict[str, Any] = {
        "source": "lfw",
        "min_faces": STRANGER_IMAGES[0],
        "n_subjects": int(ds.n_subjects),
        "n_images": int(ds.n_images),
        "input": kind,
        "calibration": source,
    }
    singles = np.zeros(0, dtype=np.int64)
    if folder is not None:
        pool = _singles_pool(cfg, folder)
        with execution.progress_bar(cfg, f"open set: {len(pool)} singles{described} (cached afterwards)") as cb:
            sg = load_dataset(
                str(folder),
                min_faces=1,
                normalisation=norm,
                progress=cb,
                encoder=encoder,
                jobs=cfg.jobs or None,
                people=pool,
            )
        x = np.asarray(sg.X if encoder is None else sg.descriptors, dtype=np.float32)
        singles = np.asarray(sg.labels, dtype=np.int64) + len(names)
        inputs = np.vstack([inputs, x])
        labels = np.concatenate([labels, singles])
        names += list(sg.target_names)
        singles = np.unique(singles)
        description["singles"] = {
            "folder": str(folder),
            "in_folder": sum(1 for p in folder.iterdir() if p.is_dir()),
            "drawn": len(pool),
            "with_a_face": int(singles.size),
        }
    return Population(
        inputs=inputs,
        labels=labels,
        names=names,
        image_shape=(int(ds.images.shape[1]), int(ds.images.shape[2])),
        description=description,
        singles=singles,
    )
