"""Open-set identification as NIST FRVT judges 1:N: FNIR at a fixed FPIR, where the decision is made.

``peep audit --open-set`` asks how often an enrolled person is missed (false-negative identification
rate, FNIR: a probe not named as its own subject) when at most a share ``fpir_target`` of strangers is
named as someone (false-positive identification rate, FPIR), for two places a decision can be made
(see docs/DESIGN.md, "Where decisions are made"):

``server``
    Today's mode: the device releases a perturbed template of the query at the audited (template) ε,
    and the server's model decides on it. Its unknown threshold is the server's own:
    :func:`~peep.server.recognition.fitting.fit_recogniser` with ``identify_far`` set to the FPIR
    target, calibrated on held-out background *people's* releases.
``device``
    The device runs the same model (a post-processing of releases only) on its own *clean* projection
    and releases only the decision, through k-ary randomized response over ``enrolled + 1`` labels at
    ``epsilon_label`` (:class:`peep.core.labels.RandomizedResponse`); ``epsilon_label = None`` is the
    decision without a label mechanism (what a door deciding locally uses). Its thresholds come from
    :func:`peep.core.decision.calibrate_clean` on clean projections of public *calibration* people the
    model never saw, accounting for the label mechanism so that the *released* FPIR meets the target.
    Where the label mechanism alone names more strangers than the target allows (its
    ``false_positive_floor``), no threshold can meet it: the row is measured at the threshold without
    that accounting and marked ``feasible: false``.

Both modes use one model per split and preset, fitted by the server's own trainer on releases only:
each enrolled person's enrolment images released once at the template ε and the background people's
images released once (the "unknown" class). Both presets named in ``open_set_presets`` are measured on
the same releases, so the project can choose the preset for decision mode by FNIR on clean queries.

A reference says what limits decision mode: the same people with no noise anywhere (a model fitted on the
clean templates, deciding on clean queries, thresholds from the calibration people), reported in
``open_set_setup["no_noise"]``.

Door verification (device mode, no label noise): every probe claims its own subject (genuine) and every
other enrolled subject (impostors); GAR is the share of genuine claims accepted at the verify threshold
``calibrate_clean`` sets for ``far_target``, next to the FAR the impostor claims reach. Server rows carry
the same figures for a claim decided on a released query with the server's verify threshold.

The people, by a rule of this section's own (independent of ``--min-faces``), drawn per split from the
LFW people in the data home with at least 5 images:

enrolled
    ``open_set_enrolled`` people with at least ``enrol_images + probes`` images: ``enrol_images`` of
    them enrolled (released once each), ``probes`` held out as probes;
strangers
    ``open_set_strangers`` people with 5 to 9 images, one capture each: never in the basis, never in
    training, never in calibration;
background
    a share of the other 5-9 image people (``open_set_background_rare``) and of the other public people
    (the frequently photographed ones not enrolled, ``open_set_background_frequent``), each dealt by number
    of images, at most ``public_max_images`` images each: their *releases* teach the model "unknown";
calibration
    where ``lfw_singles/`` is found (``open_set_calibration`` "auto" or "singles"): ``open_set_calibration_people``
    of LFW's one-image people, none of whom is in ``lfw_home/``, one clean photo each; dealt per split from
    one pool drawn by the seed, together with ``open_set_single_strangers`` one-image *strangers*, a second
    stranger population reported as ``fpir_single``. The public LFW people the background class does not take
    are then left out. Otherwise ("public"): every other public person -- neither enrolled, nor a stranger,
    nor in the background class -- with every photo (at most ``calibration_images`` when set). Their *clean*
    projections set the device's thresholds, every person weighing alike (``calibrate_clean(weights=1 /
    photos of the person)``, as a device weighs its model's ``calibration_groups``), as every stranger does
    in the FPIR.

The enrolment sweep (``open_set_enrol_sweep``) fits the same model on the first ``n`` of each enrolled
person's releases (same probes and strangers): ``open_set_setup["enrolment_sweep"]``.

The projection (and its public bounds) is fitted on the background people's faces only (``open_set_basis
= "background"``, the default), so that a calibration face is as new to the projection as a stranger's or an
enrolled person's: measured, fitting it on the calibration people's faces as well lets the device set its
thresholds on faces the whitened projection has seen, whose scores run lower than a stranger's, and the
released FPIR overshoots the target (most at large K). Never an enrolled person's or a stranger's face.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.bounding import BundleBounds, fit_bundle_bounds
from peep.core.decision import calibrate_clean, identify_open_set
from peep.core.labels import RandomizedResponse, fpir_floor
from peep.core.projections import projection_class
from peep.core.release import mechanism_for_bounds
from peep.server.audit import execution
from peep.server.audit.basis import Domain
from peep.server.audit.config import AuditConfig, AuditConfigError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

MODES = ("server", "device")
#: The groups of people of one split, in report order (``single_strangers`` and ``unused`` are empty
#: unless the singles calibrate).
GROUPS = ("enrolled", "strangers", "single_strangers", "background", "calibration", "unused")
#: Strangers are LFW people with this many images (the never-enrolled range of the staged subset).
STRANGER_IMAGES = (5, 9)
#: Singles drawn beyond the calibration people and single strangers asked for, so that a face the detector
#: misses leaves the groups their sizes: this share, plus ten.
_SINGLES_MARGIN = 0.03
# Seed streams of this section: the people partition, the template releases, the label releases, the
# singles' pool.
_PARTITION_STREAM, _TAG_RELEASE, _TAG_LABEL, _SINGLES_STREAM = 1_001, 1_002, 1_003, 1_004
_BACKGROUND_PREFIX = "background:"
_STD_KEYS = (
    "fnir",
    "fpir",
    "fpir_single",
    "fpir_model",
    "fpir_bound",
    "gar_at_far",
    "far",
    "threshold",
    "rank1_miss",
)


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


# --------------------------------------------------------------------------- population and splits


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
    with execution._progress(cfg, f"open set: LFW faces{described} (cached afterwards)") as cb:
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
        with execution._progress(cfg, f"open set: {len(pool)} singles{described} (cached afterwards)") as cb:
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


@dataclass
class Space:
    """One template dimension's projection of a split's faces (picklable: no faces, no model).

    Attributes
    ----------
    bounds : BundleBounds
        Public bounds of the projection, fitted on the public faces.
    C : dict of str to ndarray of shape (n, n_components)
        Raw coefficients of ``enrol``, ``probe``, ``stranger``, ``background`` and ``calibration`` faces.
    """

    n_components: int
    bounds: BundleBounds
    C: dict[str, FloatArray]
    n_fit: int


@dataclass
class OpenSetContext:
    """What every (template dimension, ε, preset) of one split shares."""

    split: int
    seed: int
    people: OpenSetPeople
    y_enrol: IntArray
    y_probe: IntArray
    background_people: IntArray
    calibration_people: IntArray
    spaces: list[Space] = field(default_factory=list)

    @property
    def enrol_rank(self) -> IntArray:
        """Each enrolment release's place among its person's, shape (enrolled · enrol_images,): the sweep keeps
        the first ``n``."""
        n_people = int(self.people.people["enrolled"].size)
        return np.tile(np.arange(self.people.enrol_rows.size // n_people, dtype=np.int64), n_people)


def component_limit(pop: Population, people: OpenSetPeople, cfg: AuditConfig) -> int:
    """The largest template dimension the public faces allow (identities − 1 for projections that learn them)."""
    public = people.public_rows
    limit = min(public.size - 1, pop.inputs.shape[1])
    if projection_class(cfg.projection).needs_labels:
        limit = min(limit, int(np.unique(pop.labels[public]).size) - 1)
    return int(limit)


def _rng(cfg: AuditConfig, split: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([cfg.seed, split, _PARTITION_STREAM]))


def prepare_split(pop: Population, cfg: AuditConfig, split: int) -> OpenSetContext:
    """Partition split ``split``'s people, fit each template dimension's projection on the public faces, project."""
    people = partition_people(pop.labels, cfg, _rng(cfg, split), pop.singles)
    cls = projection_class(cfg.projection)
    public = people.public_rows
    shape = pop.image_shape if cfg.mirrored(cfg.projection) else None
    groups = {
        "enrol": people.enrol_rows,
        "probe": people.probe_rows,
        "stranger": people.stranger_rows,
        "background": people.background_rows,
        "calibration": people.calibration_rows,
    }
    if people.single_stranger_rows.size:
        groups["single_stranger"] = people.single_stranger_rows
    ctx = OpenSetContext(
        split=split,
        seed=execution.split_seed(cfg, split),
        people=people,
        y_enrol=pop.labels[people.enrol_rows],
        y_probe=pop.labels[people.probe_rows],
        background_people=pop.labels[people.background_rows],
        calibration_people=pop.labels[people.calibration_rows],
    )
    X_public = np.asarray(pop.inputs[public], dtype=np.float64)
    for nc in cfg.open_set_dimensions:
        projection = cls(n_components=nc, mirror_shape=shape).fit(X_public, pop.labels[public])
        C_public = projection.transform(X_public)
        ctx.spaces.append(
            Space(
                n_components=nc,
                bounds=fit_bundle_bounds(C_public),
                C={
                    g: projection.transform(np.asarray(pop.inputs[rows], dtype=np.float64))
                    for g, rows in groups.items()
                },
                n_fit=int(public.size),
            )
        )
    return ctx


# --------------------------------------------------------------------------- one split, one model


def fit_open_set_model(
    cfg: AuditConfig,
    preset: str,
    R_enrol: FloatArray,
    y_enrol: IntArray,
    R_background: FloatArray,
    background_people: IntArray,
    seed: int,
    *,
    fpir: float,
) -> Any:
    """The server's recogniser on releases only: enrolled subjects plus the background ("unknown") class.

    The server's own trainer with its default training parameters, ``target_far`` the door's FAR and
    ``identify_far`` the FPIR target (its unknown threshold set on held-out background people's releases).
    """
    from peep.server.config import TrainingConfig
    from peep.server.recognition.fitting import fit_recogniser
    from peep.server.recognition.presets import PRESETS

    server = TrainingConfig()
    subjects = [str(int(v)) for v in y_enrol] + [f"{_BACKGROUND_PREFIX}{int(v)}" for v in background_people]
    return fit_recogniser(
        np.vstack([R_enrol, R_background]).astype(np.float32),
        subjects,
        preset=PRESETS[preset],
        background_prefix=_BACKGROUND_PREFIX,
        validation_fraction=server.validation_fraction,
        target_far=cfg.open_set_far,
        identify_far=fpir,
        min_templates_per_subject=server.min_templates_per_subject,
        random_state=seed,
        blas_threads=1,
    )


def _columns(fitted: Any, y: IntArray) -> IntArray:
    """Position of each identity ``y`` among the model's enrolled columns (``known_indices``)."""
    known = fitted.known_indices
    pos = {fitted.class_names[int(c)]: j for j, c in enumerate(known)}
    return np.array([pos[str(int(v))] for v in y], dtype=np.int64)


def _door(P_probe: FloatArray, known: NDArray[np.intp], truth: IntArray, threshold: float) -> dict[str, float]:
    """GAR of every probe's own claim and FAR of its claims to every other enrolled subject."""
    S = np.asarray(P_probe, dtype=np.float64)[:, known]
    own = np.zeros_like(S, dtype=bool)
    own[np.arange(S.shape[0]), truth] = True
    return {"gar_at_far": float(np.mean(S[own] > threshold)), "far": float(np.mean(S[~own] > threshold))}


def _rank1_miss(P_probe: FloatArray, known: NDArray[np.intp], truth: IntArray) -> float:
    """Share of probes whose most probable enrolled subject is someone else: FNIR with no threshold at all.

    What is left of FNIR once the open-set threshold is taken away (closed-set rank-1 identification), so
    a row shows how much of its FNIR is the model's rejection of strangers.
    """
    return float(np.mean(np.asarray(P_probe)[:, known].argmax(axis=1) != truth))


def _labels(P: FloatArray, known: NDArray[np.intp], threshold: float) -> IntArray:
    """The device's decision as a label: the enrolled column's position, or ``len(known)`` for unknown."""
    d = identify_open_set(P, known, threshold)
    pos = np.searchsorted(known, d.best_class)
    return np.where(d.unknown, known.size, pos).astype(np.int64)


def evaluate_split(
    ctx: OpenSetContext, cfg: AuditConfig, *, space: int, epsilon: float, eps_index: int, preset: str
) -> list[dict[str, Any]]:
    """Every row of one split, template dimension, template ε and preset (server and device modes).

    Every face is released once through the audited mechanism at ``epsilon`` with the audit's noise
    conventions; the releases are the same for every preset (the noise stream is keyed without it). The
    enrolment sweep's models (``open_set_enrol_sweep``) learn from the first ``n`` of the same releases of each
    enrolled person; their rows carry ``enrol_images`` = n.
    """
    sp = ctx.spaces[space]
    rng = execution.noise_state(cfg, (_TAG_RELEASE, ctx.split, space, eps_index))
    mech = mechanism_for_bounds(sp.bounds, kind=cfg.mechanism, epsilon=epsilon, delta=cfg.delta, random_state=rng)
    dom = Domain(cfg.mechanism, sp.bounds)
    Z = {g: dom.forward(C) for g, C in sp.C.items()}
    released = ("enrol", "background", "probe", "stranger", "single_stranger")
    R = {g: np.asarray(mech.release(Z[g]), dtype=np.float64) for g in released if g in Z}
    g = mech.guarantee
    base: dict[str, Any] = {
        "preset": preset,
        "n_components": sp.n_components,
        "epsilon_template": float(epsilon),
        "epsilon_template_vector": float(g.epsilon_vector),
        "enrolled": int(ctx.people.people["enrolled"].size),
        "probes": int(Z["probe"].shape[0]),
        "strangers": int(Z["stranger"].shape[0]),
        "background_templates": int(Z["background"].shape[0]),
        "calibration_faces": int(Z["calibration"].shape[0]),
    }
    if "single_stranger" in Z:
        base["single_strangers"] = int(Z["single_stranger"].shape[0])
    p_index = cfg.open_set_presets.index(preset)
    rank = ctx.enrol_rank
    rows: list[dict[str, Any]] = []
    for n_enrol in (cfg.open_set_enrol_images, *cfg.open_set_enrol_sweep):
        keep = rank < n_enrol
        sweep = {**base, "enrol_images": int(n_enrol)}
        models = {
            t: fit_open_set_model(
                cfg, preset, R["enrol"][keep], ctx.y_enrol[keep], R["background"], ctx.background_people, ctx.seed,
                fpir=t,
            )
            for t in cfg.open_set_fpir
        }  # fmt: skip
        rows += _server_rows(ctx, cfg, models, R, {**sweep, "mode": "server"})
        # device: the same model (thresholds aside, every fit above is the same model) on clean projections
        rows += _device_rows(
            ctx, cfg, models[cfg.open_set_fpir[0]], Z, {**sweep, "mode": "device"}, (space, eps_index, p_index)
        )
    if eps_index == 0:
        # What limits decision mode: the same task with no noise anywhere (a model fitted on clean templates).
        clean = fit_open_set_model(
            cfg, preset, Z["enrol"], ctx.y_enrol, Z["background"], ctx.background_people, ctx.seed,
            fpir=cfg.open_set_fpir[0],
        )  # fmt: skip
        ref = {
            **base,
            "enrol_images": cfg.open_set_enrol_images,
            "mode": "no_noise",
            "epsilon_template": None,
            "epsilon_template_vector": None,
        }
        rows += _device_rows(ctx, cfg, clean, Z, ref, (space, eps_index, p_index), label_epsilons=())
    return rows


def _server_rows(
    ctx: OpenSetContext, cfg: AuditConfig, models: dict[float, Any], R: dict[str, FloatArray], base: dict[str, Any]
) -> list[dict[str, Any]]:
    """Rows of the server deciding on released queries with each model's own thresholds (one per FPIR target)."""
    rows: list[dict[str, Any]] = []
    for t, fitted in models.items():
        known = fitted.known_indices
        truth = _columns(fitted, ctx.y_probe)
        P_probe = fitted.predict_proba(R["probe"])
        lab_p = _labels(P_probe, known, fitted.unknown_threshold)
        named = _labels(fitted.predict_proba(R["stranger"]), known, fitted.unknown_threshold) < known.size
        row: dict[str, Any] = {
            **base,
            "epsilon_label": None,
            "fpir_target": t,
            "fnir": float(np.mean(lab_p != truth)),
            "fpir": float(np.mean(named)),
            "fpir_model": float(np.mean(named)),
        }
        if "single_stranger" in R:
            named_single = _labels(fitted.predict_proba(R["single_stranger"]), known, fitted.unknown_threshold)
            row["fpir_single"] = row["fpir_model_single"] = float(np.mean(named_single < known.size))
        row.update(
            {
                "fpir_floor": 0.0,
                "feasible": True,
                "threshold": float(fitted.unknown_threshold),
                "rank1_miss": _rank1_miss(P_probe, known, truth),
                "far_target": cfg.open_set_far,
                **_door(P_probe, known, truth, float(fitted.verify_threshold)),
            }
        )
        rows.append(row)
    return rows


def any_mechanism_fpir_bound(subjects: int, epsilon_label: float, fnir: float) -> float:
    """The least FPIR *any* ε-LDP label mechanism releases at a given FNIR: ``subjects · e^−ε · (1 − FNIR)``.

    :func:`peep.core.labels.fpir_floor`, the bound a device refuses a target under (docs/DECISIONS.md).
    """
    return fpir_floor(int(subjects), float(epsilon_label), float(fnir))


def _device_rows(
    ctx: OpenSetContext,
    cfg: AuditConfig,
    fitted: Any,
    Z: dict[str, FloatArray],
    base: dict[str, Any],
    key: tuple[int, ...],
    label_epsilons: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """Rows of a model deciding on clean projections ``Z``, without and with the label mechanism.

    Thresholds from :func:`~peep.core.decision.calibrate_clean` on the calibration people's clean
    projections, every person weighing alike (one over their number of faces, as a device weighs its
    model's ``calibration_groups``); door figures on the row without label noise.
    """
    known = fitted.known_indices
    truth = _columns(fitted, ctx.y_probe)
    P_probe, P_stranger = fitted.predict_proba(Z["probe"]), fitted.predict_proba(Z["stranger"])
    P_single = fitted.predict_proba(Z["single_stranger"]) if "single_stranger" in Z else None
    P_cal = fitted.predict_proba(Z["calibration"])
    w_cal = person_weights(ctx.calibration_people)
    eps_labels = cfg.open_set_label_epsilons if label_epsilons is None else label_epsilons
    rows: list[dict[str, Any]] = []
    for li, eps_label in enumerate((None, *eps_labels)):
        for ti, t in enumerate(cfg.open_set_fpir):
            rr = None
            if eps_label is not None:
                stream = execution.noise_state(cfg, (_TAG_LABEL, ctx.split, *key, li, ti))
                rr = RandomizedResponse(known.size + 1, eps_label, random_state=stream)
            floor = 0.0 if rr is None else rr.false_positive_floor
            feasible = floor < t
            th = calibrate_clean(
                P_cal,
                known,
                fpir=t,
                far=cfg.open_set_far,
                label_false_positive=floor if feasible else 0.0,
                label_keep=1.0 if rr is None or not feasible else rr.keep_probability,
                weights=w_cal,
            )
            lab_p = _labels(P_probe, known, th.unknown_threshold)
            lab_s = _labels(P_stranger, known, th.unknown_threshold)
            draws = 1 if rr is None else cfg.open_set_label_draws
            rel_p = np.tile(lab_p, draws) if rr is None else rr.release(np.tile(lab_p, draws))
            rel_s = np.tile(lab_s, draws) if rr is None else rr.release(np.tile(lab_s, draws))
            fnir = float(np.mean(rel_p != np.tile(truth, draws)))
            row: dict[str, Any] = {
                **base,
                "epsilon_label": eps_label,
                "fpir_target": t,
                "fnir": fnir,
                "fpir": float(np.mean(rel_s != known.size)),
                "fpir_model": float(np.mean(lab_s != known.size)),
            }
            if P_single is not None:
                lab_1 = _labels(P_single, known, th.unknown_threshold)
                rel_1 = np.tile(lab_1, draws) if rr is None else rr.release(np.tile(lab_1, draws))
                row["fpir_single"] = float(np.mean(rel_1 != known.size))
                row["fpir_model_single"] = float(np.mean(lab_1 != known.size))
            row |= {
                "fpir_model_target": float(th.fpir_model_target),
                "fpir_floor": float(floor),
                "fpir_bound": 0.0 if eps_label is None else any_mechanism_fpir_bound(known.size, eps_label, fnir),
                "feasible": bool(feasible),
                "threshold": float(th.unknown_threshold),
                "fpir_calibration": float(th.fpir_public),
                "rank1_miss": _rank1_miss(P_probe, known, truth),
            }
            if rr is None:
                row["far_target"] = cfg.open_set_far
                row.update(_door(P_probe, known, truth, th.verify_threshold))
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- jobs and aggregation


def _prepare_job(pop: Population, cfg: AuditConfig, split: int) -> tuple[OpenSetContext, float]:
    t = time.process_time()
    with execution.job_env(cfg):
        ctx = prepare_split(pop, cfg, split)
    return ctx, time.process_time() - t


def _evaluate_job(ctx: OpenSetContext, cfg: AuditConfig, kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    t = time.process_time()
    with execution.job_env(cfg):
        rows = evaluate_split(ctx, cfg, **kwargs)
    return rows, time.process_time() - t


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies an entry: dimension, mode, preset, template ε, label ε, FPIR target, enrolment releases."""
    return (
        row["n_components"],
        row["mode"],
        row["preset"],
        row["epsilon_template"],
        row["epsilon_label"],
        row["fpir_target"],
        row["enrol_images"],
    )


#: Keys an ``open_set[]`` entry shows first (the rest follow in the order a row was built).
_FIRST_KEYS = (
    "mode",
    "preset",
    "n_components",
    "enrol_images",
    "epsilon_template",
    "epsilon_label",
    "fpir_target",
    "fnir",
    "fpir",
    "fpir_single",
)


def combine(per_split: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ``open_set[]`` entry from the rows of its splits: means, ``std`` and each split's figures.

    Every split has the same numbers of probes and strangers, so the mean over splits is the pooled rate.
    """
    mean, std = execution.aggregate(per_split)
    mean = {k: mean[k] for k in _FIRST_KEYS if k in mean} | mean
    mean["std"] = {k: std.get(k) for k in _STD_KEYS if k in std}
    mean["n_repeats"] = len(per_split)
    mean["per_repeat"] = {k: [float(r[k]) for r in per_split] for k in _STD_KEYS if k in per_split[0]}
    return mean


def choose_preset(entries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The preset with the lowest mean FNIR on clean queries (device mode, no label noise), and by how much."""
    rows = [e for e in entries if e["mode"] == "device" and e["epsilon_label"] is None]
    if not rows:
        return None
    fnir: dict[str, dict[str, float]] = {}
    for e in rows:
        where = f"K={e['n_components']}, ε={e['epsilon_template']:g}, FPIR {e['fpir_target']:g}"
        fnir.setdefault(e["preset"], {})[where] = float(e["fnir"])
    means = {p: float(np.mean(list(v.values()))) for p, v in fnir.items()}
    ranked = sorted(means, key=lambda p: means[p])
    return {
        "criterion": "mean FNIR over template dimensions, template ε and FPIR targets, device mode without label "
        "noise (the model deciding on clean queries)",
        "fnir": fnir,
        "mean_fnir": means,
        "winner": ranked[0],
        "margin": means[ranked[1]] - means[ranked[0]] if len(ranked) > 1 else None,
    }


def setup(cfg: AuditConfig, pop: Population, contexts: Sequence[OpenSetContext]) -> dict[str, Any]:
    """What the section's people, projection, thresholds and label mechanism were (``open_set_setup``)."""
    people = {g: [int(c.people.people[g].size) for c in contexts] for g in GROUPS}
    faces = {
        "enrolment": [int(c.people.enrol_rows.size) for c in contexts],
        "probes": [int(c.people.probe_rows.size) for c in contexts],
        "strangers": [int(c.people.stranger_rows.size) for c in contexts],
        "single_strangers": [int(c.people.single_stranger_rows.size) for c in contexts],
        "background": [int(c.people.background_rows.size) for c in contexts],
        "calibration": [int(c.people.calibration_rows.size) for c in contexts],
    }
    k = cfg.open_set_enrolled + 1
    labels = []
    for e in cfg.open_set_label_epsilons:
        rr = RandomizedResponse(k, e)  # the law only: no label is released
        labels.append(
            {
                "epsilon_label": e,
                "labels": k,
                "keep_probability": rr.keep_probability,
                "false_positive_floor": rr.false_positive_floor,
            }
        )
    return {
        "population": pop.description,
        "people": people,
        "faces": faces,
        "n_components": list(cfg.open_set_dimensions),
        "presets": list(cfg.open_set_presets),
        "fpir_targets": list(cfg.open_set_fpir),
        "far_target": cfg.open_set_far,
        "label_mechanism": {"kind": "k-rr", "labels": k, "draws": cfg.open_set_label_draws, "epsilons": labels},
        "rule": (
            f"per split: {cfg.open_set_enrolled} enrolled people drawn from the LFW people with at least "
            f"{cfg.open_set_enrol_images + cfg.open_set_probes} images ({cfg.open_set_enrol_images} enrolment images "
            f"released once each at the template ε, {cfg.open_set_probes} probes each); {cfg.open_set_strangers} "
            f"strangers drawn from the people with {STRANGER_IMAGES[0]}-{STRANGER_IMAGES[1]} images, one capture "
            "each; the public, everyone else: " + _division(cfg, pop) + " Independent of --min-faces."
        ),
        "calibration": {
            "population": pop.description.get("calibration", "public"),
            "singles": pop.description.get("singles"),
            "people": people["calibration"],
            "faces": faces["calibration"],
            "of_the_strangers_range": [
                int(np.sum(np.isin(c.people.people["calibration"], _range_people(pop)))) for c in contexts
            ],
            "images_per_person": "every photo"
            if cfg.open_set_calibration_images is None
            else f"at most {cfg.open_set_calibration_images}",
            "weights": "1 / (the person's calibration faces): every calibration person weighs alike in the "
            "thresholds (calibrate_clean(weights=...)), as a device weighs its model's calibration_groups",
        },
        "basis": f"{cfg.projection} fitted per split on "
        + (
            "the background people's faces only (at most "
            f"{cfg.open_set_public_max_images} each), so that a calibration face is as unseen by the projection as "
            "a stranger's or an enrolled person's"
            if cfg.open_set_basis == "background"
            else f"every public person's faces (at most {cfg.open_set_public_max_images} each, calibration people "
            "included)"
        )
        + "; never an enrolled person's or a stranger's",
        "server_threshold": "the server's fit_recogniser with identify_far = the FPIR target: held-out background "
        "people's releases (cross-fitted for linear presets)",
        "device_threshold": "peep.core.decision.calibrate_clean on the calibration people's clean projections, "
        "every person weighing alike, accounting for the label mechanism so that the released FPIR meets the "
        "target",
        "label_draws_note": f"each decision is released {cfg.open_set_label_draws} times independently (as many "
        "simulated appearances of the same face, each at epsilon_label) and the rates averaged over the draws: "
        "what one release gives in expectation, with less simulation noise",
        "note": "fnir: share of probes not released as their own subject (called unknown or named as someone "
        "else); fpir: share of strangers released as some enrolled subject; fpir_model: the same before the label "
        "mechanism; rank1_miss: probes whose most probable enrolled subject is someone else (no threshold). "
        "Every split has the same numbers of probes and strangers, so the means are pooled rates. "
        "feasible: false where the label mechanism alone names more strangers than the target allows "
        "(fpir_floor >= fpir_target); such rows use the threshold without the label accounting.",
        "decision_preset": None,
    }


def _range_people(pop: Population) -> IntArray:
    """The population's people with as many images as a stranger has (:data:`STRANGER_IMAGES`)."""
    ids, counts = np.unique(pop.labels, return_counts=True)
    return ids[(counts >= STRANGER_IMAGES[0]) & (counts <= STRANGER_IMAGES[1])]


def _division(cfg: AuditConfig, pop: Population) -> str:
    """The rule dividing the public people between the model's background class and calibration, in words."""
    lo, hi = STRANGER_IMAGES
    singles = pop.description.get("singles")

    def share(x: float) -> str:
        return {0.0: "none", 1.0: "all"}.get(x, f"a share {x:g}")

    cap = (
        "every photo"
        if cfg.open_set_calibration_images is None
        else f"at most {cfg.open_set_calibration_images} images"
    )
    background = (
        f"of the other people with {lo}-{hi} images (the strangers' own range), {share(cfg.open_set_background_rare)} "
        f"go to the model's background class, and of the other public people (the frequently photographed ones "
        f"not enrolled), {share(cfg.open_set_background_frequent)} (each dealt by number of images); background "
        f"people's faces (at most {cfg.open_set_public_max_images} each) are released once each (the model's "
        "unknown class)."
    )
    if singles is None:
        return (
            f"{background} Every other public person is a calibration person: {cap} each, clean, every person "
            "weighing alike (the device's thresholds)."
        )
    return (
        f"{background} The public LFW people the background class does not take are left out. LFW's one-image "
        f"people (lfw_singles/, none of them in lfw_home/: {singles['drawn']} of its {singles['in_folder']} drawn "
        f"once by the seed, {singles['with_a_face']} with a detected face) are dealt anew per split: "
        f"{cfg.open_set_single_strangers} one-capture strangers (a second stranger population) and "
        f"{cfg.open_set_calibration_people} calibration people (their one photo, clean: the device's thresholds). "
        "No stranger of either population is in the projection's basis, the background class or the calibration."
    )


def run_open_set(cfg: AuditConfig) -> tuple[list[dict[str, Any]], dict[str, Any], float]:
    """The whole section: ``(open_set entries, open_set_setup, CPU seconds of its jobs)``."""
    pop = load_population(cfg)
    first = partition_people(pop.labels, cfg, _rng(cfg, 0), pop.singles)
    limit = component_limit(pop, first, cfg)
    for nc in cfg.open_set_dimensions:
        if nc > limit:
            raise AuditConfigError(
                f"--open-set-components: expected values at most {limit} for {cfg.projection} (the public faces, or "
                f"for projections that learn identities the public people, minus one), received {nc}"
            )
    prepared, cpu = execution.run_jobs(
        cfg, [(_prepare_job, (pop, cfg, r)) for r in range(cfg.repeats)], "audit: open set, people and projections"
    )
    contexts: list[OpenSetContext] = list(prepared)
    jobs: list[tuple[Any, tuple[Any, ...]]] = []
    for ctx in contexts:
        for s in range(len(cfg.open_set_dimensions)):
            for ei, eps in enumerate(cfg.epsilons):
                for preset in cfg.open_set_presets:
                    kw = {"space": s, "epsilon": eps, "eps_index": ei, "preset": preset}
                    jobs.append((_evaluate_job, (ctx, cfg, kw)))
    results, c = execution.run_jobs(cfg, jobs, "audit: open set, server and device decisions")
    cpu += c
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rows in results:
        for row in rows:
            groups.setdefault(row_key(row), []).append(row)
    modes = {m: i for i, m in enumerate(MODES)}

    def order(k: tuple[Any, ...]) -> tuple[Any, ...]:
        eps_t = 0.0 if k[3] is None else k[3]
        eps_l = -1.0 if k[4] is None else k[4]
        return (-k[6], k[0], eps_t, modes.get(k[1], len(modes)), cfg.open_set_presets.index(k[2]), eps_l, -k[5])

    keys = sorted(groups, key=order)
    full = cfg.open_set_enrol_images
    entries = [combine(groups[k]) for k in keys if k[1] in MODES and k[6] == full]
    info = setup(cfg, pop, contexts)
    info["decision_preset"] = choose_preset(entries)
    info["no_noise"] = [combine(groups[k]) for k in keys if k[1] not in MODES]
    info["enrolment_sweep"] = [combine(groups[k]) for k in keys if k[1] in MODES and k[6] != full]
    return entries, info, cpu
