"""Parameters of one ``peep audit`` run (frozen, keyword-only, validated)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from peep.core.mechanisms import MECHANISM_KINDS, mechanism_classes
from peep.core.projections import projection_class, projection_kinds
from peep.server.recognition.presets import DEFAULT_PRESET, PRESETS, MLPPreset, Preset

#: ε values of the default audit (7 values, per-coordinate for peep/peep-raw).
DEFAULT_EPSILONS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: Per-vector ε values at which ``--frontier`` finds the best setting.
DEFAULT_FRONTIER_EPSILONS: tuple[float, ...] = (16.0, 64.0, 256.0, 1024.0, 4096.0)
#: Mechanisms the frontier searches. ``laplace-vector`` is left out: it is the
#: same noise as ``peep`` at per-coordinate ε = ε/nc, so it adds nothing.
#: Kinds the frontier searches: every registered kind that does not duplicate another's noise.
FRONTIER_MECHANISMS: tuple[str, ...] = tuple(k for k, c in mechanism_classes().items() if c.frontier)
BASES = ("train", "background")
#: Presets the open-set section measures by default: shrinkage LDA and the server's default MLP.
DEFAULT_OPEN_SET_PRESETS: tuple[str, ...] = ("lda", "default")
#: ε of the device's label mechanism (k-ary randomized response) measured by the open-set section.
DEFAULT_OPEN_SET_LABEL_EPSILONS: tuple[float, ...] = (2.0, 4.0, 8.0)
DEFAULT_BYSTANDER_LABEL_EPSILONS: tuple[float, ...] = (2.0, 4.0, 8.0)
#: FPIR targets of the open-set section (NIST FRVT reports FNIR at FPIR 1 % and 0.1 %).
DEFAULT_OPEN_SET_FPIR: tuple[float, ...] = (0.01, 0.001)
NORMALISATIONS = ("detector", "lfw-crop")
#: Who may set the open-set section's device thresholds (``open_set_calibration``).
OPEN_SET_CALIBRATIONS = ("auto", "singles", "public")


class AuditConfigError(ValueError):
    """An audit parameter is out of range (the message names the option)."""


def _check(cond: bool, option: str, expected: str, received: Any) -> None:
    if not cond:
        raise AuditConfigError(f"{option}: expected {expected}, received {received!r}")


@dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """Everything that determines an audit's numbers.

    Attributes
    ----------
    dataset : str
        ``"lfw"`` or a folder-per-identity directory.
    data_home : str or None
        scikit-learn data home holding ``lfw_home/``.
    min_faces : int
        Identities with at least this many usable images.
    normalisation : {"detector", "lfw-crop"}
        Face crop: the edge agent's detector path, or scikit-learn's fixed LFW
        crop as in the PEEP paper.
    mechanism : str
        One of :data:`peep.core.mechanisms.MECHANISM_KINDS`.
    epsilons : tuple of float
        The mechanism's ε parameter (per coordinate for ``peep``/``peep-raw``,
        per vector otherwise; reports show both).
    delta : float
        δ for ``gaussian-l2``.
    projection : str
        What templates are: one of :func:`peep.core.projections.projection_kinds`
        (``eigenfaces``, the paper's, or ``fisherfaces``, which needs
        ``basis="background"``).
    components : int
        Dimension of a template (nc eigenfaces, K Fisherfaces).
    repeats : int
        Random stratified splits; every number is mean ± std over them.
    test_size : float
        Fraction of each identity's images held out (0.3 = the paper's 70/30).
    preset : str
        Recogniser preset from :data:`peep.server.recognition.presets.PRESETS`,
        fitted by the server's own :func:`~peep.server.recognition.fitting.fit_recogniser`
        (default: the server's default preset).
    hidden : int or None
        One hidden layer of this many units instead of the preset's layers
        (MLP presets only; None = the preset as registered).
    basis : {"train", "background"}
        Where the projection and public bounds are fitted: each split's
        training part (as the paper), or a disjoint public background
        population (as a deployed bundle): every LFW identity in the data home
        that is not audited (for ``lfw``, the people with 5 to
        ``min_faces − 1`` images; for a folder, LFW's people with at least 5
        images whose names are not in it). Never the released test faces.
    mirror : bool or None
        Fit the projection on the basis faces' mirror images too (None: the
        projection's default: on for Fisherfaces, off for eigenfaces).
    background_max_faces : int or None
        Only LFW people with at most this many images form the background
        (None: ``min_faces − 1`` for ``lfw``, no limit for a folder); a smaller
        background is quicker to normalise the first time.
    seed : int
        Seeds splits, recognisers and (with the seeded sampler) the noise.
    secure_noise : bool
        Use the secure sampler (OS randomness, FP-safe, slower) instead of the
        seeded simulation sampler.
    jobs : int
        Worker processes (0 = one per CPU).
    sweep_components, sweep_images : tuple of int
        Points of the utility-vs-nc and utility-vs-images-per-subject curves.
    sweep_epsilon : float or None
        ε of the private curve in the sweeps (None: 8 if listed, else the
        median of ``epsilons``).
    subset_sizes : tuple of int
        Reduced candidate sets for linkage (Hanisch et al.).
    averaging : tuple of int
        Numbers of releases averaged by the averaging attack.
    frontier : bool
        Also search projection × nc × mechanism × bounds for the best accuracy
        at each per-vector ε in ``frontier_epsilons``.
    frontier_components : tuple of int
    frontier_projections : tuple of str
        Projections the frontier searches (empty: every registered one the
        basis allows — projections that learn from identities need
        ``basis="background"``).
    bystander : bool
        Measure how well an operator holding what the server kept links a
        stranger's appearances (:mod:`peep.lab.audit.bystander`), with
        strangers, calibration and public people drawn from LFW's identities
        outside the audited ones (the background population, or the same
        range of people with ``basis="train"``).
    bystander_label_epsilons : tuple of float
        ε of the k-ary randomized response a device in decision mode releases each decision through, in the
        bystander section's decision mode (the decision without a label mechanism is always measured too).
    site_keys : int
        Sites, each with its own simulated site key, for the template-protection section
        (:mod:`peep.lab.audit.protection`); 0 skips it, otherwise at least 2.
    open_set : bool
        Measure open-set identification as NIST FRVT does (FNIR at fixed FPIR), the server deciding on a
        released query and a device deciding on its clean projection and releasing only the label
        (:mod:`peep.lab.audit.open_set`). Its people follow the section's own rule (LFW, independent
        of ``min_faces``).
    open_set_enrolled, open_set_enrol_images, open_set_probes : int
        Enrolled people, enrolment images each (released once each), held-out probes each.
    open_set_strangers : int
        One-capture strangers (LFW people with 5 to 9 images).
    open_set_calibration : str
        Who sets the device's thresholds: ``"singles"`` (LFW's one-image people in ``lfw_singles/``, who are
        in no other group by construction), ``"public"`` (the public LFW people neither enrolled, nor
        strangers, nor in the background class: the rule before the singles) or ``"auto"`` (the singles when
        the folder is found, see :func:`peep.server.datasets.singles_folder`).
    open_set_calibration_people : int
        With the singles: calibration people per split, one photo each.
    open_set_single_strangers : int
        With the singles: one-capture strangers per split drawn from the singles, a second stranger
        population beside ``open_set_strangers`` (never a calibration person of the same split).
    open_set_enrol_sweep : tuple of int
        Enrolment releases per person also measured, each below ``open_set_enrol_images``: the model is
        fitted on the first ``n`` of each enrolled person's releases, with the same probes and strangers.
    open_set_public_max_images : int
        Images per background person, at most.
    open_set_calibration_images : int or None
        Images per calibration person, at most (None: every photo; each person weighs alike in the device's
        thresholds whatever their number of photos).
    open_set_background_rare, open_set_background_frequent : float
        Shares of the public people of the strangers' range (5-9 images) and of the other public people
        (the frequently photographed ones not enrolled) dealt to the model's background class; every other
        public person calibrates the device's thresholds.
    open_set_basis : str
        Whose faces the section's projection is fitted on: ``"background"`` (the background class's people
        only, so that a calibration face is as unseen by the projection as a stranger's) or ``"public"``
        (every public person, calibration people included).
    open_set_components : tuple of int
        Template dimensions of the section (empty: ``components``).
    open_set_label_epsilons : tuple of float
        ε of the device's k-ary randomized response on the label (the row without label noise is always
        measured).
    open_set_label_draws : int
        Independent label releases per decision (the rates are averaged over them).
    open_set_fpir : tuple of float
        FPIR targets.
    open_set_far : float
        FAR target of door verification.
    open_set_presets : tuple of str
        Recogniser presets measured in both modes.
    grid_faces : int
        Faces in the reconstruction image grid.
    progress : bool
        Progress on stderr (:mod:`peep.server.progress`).
    """

    dataset: str = "lfw"
    data_home: str | None = None
    min_faces: int = 100
    normalisation: str = "detector"
    mechanism: str = "peep"
    epsilons: tuple[float, ...] = DEFAULT_EPSILONS
    delta: float = 1e-5
    projection: str = "eigenfaces"
    components: int = 128
    repeats: int = 3
    test_size: float = 0.3
    preset: str = DEFAULT_PRESET
    hidden: int | None = None
    basis: str = "train"
    background_max_faces: int | None = None
    mirror: bool | None = None
    seed: int = 0
    secure_noise: bool = False
    jobs: int = 0
    sweep_components: tuple[int, ...] = (8, 16, 32, 64, 128)
    sweep_images: tuple[int, ...] = (10, 25, 50)
    sweep_epsilon: float | None = None
    subset_sizes: tuple[int, ...] = (3, 5, 10)
    averaging: tuple[int, ...] = (1, 5, 20)
    frontier: bool = False
    frontier_epsilons: tuple[float, ...] = DEFAULT_FRONTIER_EPSILONS
    frontier_components: tuple[int, ...] = (16, 40, 64, 128)
    frontier_projections: tuple[str, ...] = ()
    bystander: bool = True
    bystander_label_epsilons: tuple[float, ...] = DEFAULT_BYSTANDER_LABEL_EPSILONS
    site_keys: int = 0
    open_set: bool = False
    open_set_enrolled: int = 10
    open_set_enrol_images: int = 20
    open_set_probes: int = 6
    open_set_strangers: int = 134
    open_set_calibration: str = "auto"
    open_set_calibration_people: int = 1000
    open_set_single_strangers: int = 1000
    open_set_enrol_sweep: tuple[int, ...] = (5, 10)
    open_set_public_max_images: int = 20
    open_set_calibration_images: int | None = None
    open_set_background_rare: float = 1.0
    open_set_background_frequent: float = 0.0
    open_set_basis: str = "background"
    open_set_components: tuple[int, ...] = ()
    open_set_label_epsilons: tuple[float, ...] = DEFAULT_OPEN_SET_LABEL_EPSILONS
    open_set_label_draws: int = 25
    open_set_fpir: tuple[float, ...] = DEFAULT_OPEN_SET_FPIR
    open_set_far: float = 0.001
    open_set_presets: tuple[str, ...] = DEFAULT_OPEN_SET_PRESETS
    grid_faces: int = 6
    progress: bool = True

    def __post_init__(self) -> None:
        _check(self.mechanism in MECHANISM_KINDS, "--mechanism", f"one of {', '.join(MECHANISM_KINDS)}", self.mechanism)
        _check(self.site_keys == 0 or 2 <= self.site_keys <= 64, "--site-keys", "0 or 2-64 sites", self.site_keys)
        if self.site_keys:
            from peep.core.release import check_keyed_kind

            try:
                check_keyed_kind(self.mechanism)
            except ValueError as exc:
                raise AuditConfigError(f"--site-keys: {exc}") from None
        _check(len(self.epsilons) >= 1, "--epsilons", "at least one value", self.epsilons)
        for e in self.bystander_label_epsilons:
            _check(math.isfinite(e) and 0 < e <= 40, "--bystander-label-epsilons", "values in (0, 40]", e)
        _check(
            self.bystander or self.bystander_label_epsilons == DEFAULT_BYSTANDER_LABEL_EPSILONS,  # refused, not ignored
            "--bystander-label-epsilons",
            "no value with --no-bystander",
            self.bystander_label_epsilons,
        )
        top = mechanism_classes()[self.mechanism].max_epsilon
        for e in self.epsilons:
            _check(math.isfinite(e) and e > 0, "--epsilons", "finite values > 0", e)
            _check(e <= top, "--epsilons", f"values <= {top:g} for {self.mechanism}", e)
        _check(len(set(self.epsilons)) == len(self.epsilons), "--epsilons", "distinct values", self.epsilons)
        _check(0.0 < self.delta < 1.0, "--delta", "a value in (0, 1)", self.delta)
        _check(self.components >= 1, "--components", ">= 1", self.components)
        kinds = projection_kinds()
        _check(self.projection in kinds, "--projection", f"one of {', '.join(kinds)}", self.projection)
        for kind in self.frontier_projections:
            _check(kind in kinds, "--frontier-projections", f"values among {', '.join(kinds)}", kind)
        _check(self.repeats >= 1, "--repeats", ">= 1", self.repeats)
        _check(0.05 <= self.test_size <= 0.8, "--test-size", "a fraction in [0.05, 0.8]", self.test_size)
        _check(self.preset in PRESETS, "--preset", f"one of {', '.join(PRESETS)}", self.preset)
        if self.hidden is not None:
            _check(self.hidden >= 1, "--hidden", ">= 1", self.hidden)
            _check(
                isinstance(PRESETS[self.preset], MLPPreset),
                "--hidden",
                "no value with a preset that is not an MLP",
                self.hidden,
            )
        _check(self.min_faces >= 2, "--min-faces", ">= 2 (a train and a test image per identity)", self.min_faces)
        _check(self.basis in BASES, "--basis", f"one of {', '.join(BASES)}", self.basis)
        _check(
            self.normalisation in NORMALISATIONS,
            "--normalisation",
            f"one of {', '.join(NORMALISATIONS)}",
            self.normalisation,
        )
        _check(self.jobs >= 0, "--jobs", ">= 0", self.jobs)
        _check(all(n >= 1 for n in self.sweep_components), "--sweep-components", "values >= 1", self.sweep_components)
        _check(
            all(n >= 2 for n in self.sweep_images),
            "--sweep-images",
            "values >= 2 (the server's training holds out validation templates of each subject)",
            self.sweep_images,
        )
        _check(all(n >= 2 for n in self.subset_sizes), "--subset-sizes", "values >= 2", self.subset_sizes)
        _check(all(k >= 1 for k in self.averaging), "--averaging", "values >= 1", self.averaging)
        _check(
            all(math.isfinite(e) and e > 0 for e in self.frontier_epsilons),
            "--frontier-epsilons",
            "finite values > 0",
            self.frontier_epsilons,
        )
        _check(
            all(n >= 1 for n in self.frontier_components),
            "--frontier-components",
            "values >= 1",
            self.frontier_components,
        )
        _check(self.grid_faces >= 1, "--grid-faces", ">= 1", self.grid_faces)
        self._check_open_set()
        if self.sweep_epsilon is not None:
            _check(
                math.isfinite(self.sweep_epsilon) and self.sweep_epsilon > 0,
                "--sweep-epsilon",
                "a finite value > 0",
                self.sweep_epsilon,
            )
        if projection_class(self.projection).needs_labels:
            _check(
                self.basis == "background",
                "--basis",
                f"'background' with --projection {self.projection} (it learns from identities: fitted on the "
                "audited people it would be neither public nor honest)",
                self.basis,
            )
        if self.mirror:
            _check(
                projection_class(self.projection).input_kind == "pixels",
                "--mirror",
                f"no mirroring with --projection {self.projection} (its input is a "
                f"{projection_class(self.projection).input_kind} descriptor, not pixels)",
                self.mirror,
            )
        if self.background_max_faces is not None:
            _check(self.background_max_faces >= 5, "--background-max-faces", ">= 5", self.background_max_faces)
            if self.dataset == "lfw":
                _check(
                    self.background_max_faces < self.min_faces,
                    "--background-max-faces",
                    f"< --min-faces {self.min_faces} (the background must not contain audited people)",
                    self.background_max_faces,
                )
        if self.basis == "background" and self.dataset == "lfw":
            _check(
                self.min_faces > 5,
                "--min-faces",
                "> 5 with --basis background (the background is LFW's people with 5 to min_faces - 1 images)",
                self.min_faces,
            )

    def _check_open_set(self) -> None:
        if not self.open_set:
            # An open-set option without the section would be silently ignored: refuse it by name.
            for f in fields(self):
                if f.name.startswith("open_set_") and getattr(self, f.name) != f.default:
                    _check(False, "--" + f.name.replace("_", "-"), "no value without --open-set", getattr(self, f.name))
            return
        _check(
            self.dataset == "lfw", "--open-set", "--dataset lfw (the section draws its people from LFW)", self.dataset
        )
        _check(self.open_set_enrolled >= 2, "--open-set-enrolled", ">= 2 people", self.open_set_enrolled)
        _check(self.open_set_enrol_images >= 2, "--open-set-enrol-images", ">= 2", self.open_set_enrol_images)
        _check(self.open_set_probes >= 1, "--open-set-probes", ">= 1", self.open_set_probes)
        _check(self.open_set_strangers >= 10, "--open-set-strangers", ">= 10 people", self.open_set_strangers)
        _check(
            self.open_set_calibration in OPEN_SET_CALIBRATIONS,
            "--open-set-calibration",
            " or ".join(OPEN_SET_CALIBRATIONS),
            self.open_set_calibration,
        )
        _check(
            self.open_set_calibration_people >= 10,
            "--open-set-calibration-people",
            ">= 10 people",
            self.open_set_calibration_people,
        )
        _check(
            self.open_set_single_strangers >= 10,
            "--open-set-single-strangers",
            ">= 10 people",
            self.open_set_single_strangers,
        )
        _check(
            all(2 <= n < self.open_set_enrol_images for n in self.open_set_enrol_sweep)
            and len(set(self.open_set_enrol_sweep)) == len(self.open_set_enrol_sweep),
            "--open-set-enrol-sweep",
            f"distinct values from 2 to {self.open_set_enrol_images - 1} (below the enrolment images), or none",
            self.open_set_enrol_sweep,
        )
        _check(
            self.open_set_public_max_images >= 1,
            "--open-set-public-max-images",
            ">= 1",
            self.open_set_public_max_images,
        )
        _check(
            self.open_set_calibration_images is None or self.open_set_calibration_images >= 1,
            "--open-set-calibration-images",
            ">= 1 or none (every photo)",
            self.open_set_calibration_images,
        )
        _check(
            self.open_set_basis in ("background", "public"),
            "--open-set-basis",
            "background or public",
            self.open_set_basis,
        )
        for name in ("open_set_background_rare", "open_set_background_frequent"):
            share = getattr(self, name)
            _check(0.0 <= share <= 1.0, "--" + name.replace("_", "-"), "a share in [0, 1]", share)
        _check(
            all(n >= 1 for n in self.open_set_components),
            "--open-set-components",
            "values >= 1",
            self.open_set_components,
        )
        _check(
            len(set(self.open_set_components)) == len(self.open_set_components),
            "--open-set-components",
            "distinct values",
            self.open_set_components,
        )
        for e in self.open_set_label_epsilons:
            _check(math.isfinite(e) and 0 < e <= 40, "--open-set-label-epsilons", "values in (0, 40]", e)
        _check(
            len(set(self.open_set_label_epsilons)) == len(self.open_set_label_epsilons),
            "--open-set-label-epsilons",
            "distinct values",
            self.open_set_label_epsilons,
        )
        _check(self.open_set_label_draws >= 1, "--open-set-label-draws", ">= 1", self.open_set_label_draws)
        _check(len(self.open_set_fpir) >= 1, "--open-set-fpir", "at least one value", self.open_set_fpir)
        for t in self.open_set_fpir:
            _check(0 < t < 0.5, "--open-set-fpir", "values in (0, 0.5)", t)
        _check(
            len(set(self.open_set_fpir)) == len(self.open_set_fpir),
            "--open-set-fpir",
            "distinct values",
            self.open_set_fpir,
        )
        _check(0 < self.open_set_far < 0.5, "--open-set-far", "a value in (0, 0.5)", self.open_set_far)
        _check(len(self.open_set_presets) >= 1, "--open-set-presets", "at least one preset", self.open_set_presets)
        for p in self.open_set_presets:
            _check(p in PRESETS, "--open-set-presets", f"values among {', '.join(PRESETS)}", p)
        _check(
            len(set(self.open_set_presets)) == len(self.open_set_presets),
            "--open-set-presets",
            "distinct values",
            self.open_set_presets,
        )

    @property
    def open_set_dimensions(self) -> tuple[int, ...]:
        """Template dimensions of the open-set section: ``open_set_components``, else ``components``."""
        return self.open_set_components or (self.components,)

    def mirrored(self, projection: str) -> bool:
        """Whether ``projection`` is fitted on mirrored basis faces too (never for descriptor inputs)."""
        cls = projection_class(projection)
        if cls.input_kind != "pixels":
            return False
        return cls.mirror_by_default if self.mirror is None else self.mirror

    @property
    def background_faces_range(self) -> tuple[int, int | None]:
        """(min, max) images per LFW person in the background population."""
        if self.background_max_faces is not None:
            return 5, self.background_max_faces
        return 5, (self.min_faces - 1 if self.dataset == "lfw" else None)

    @property
    def searched_projections(self) -> tuple[str, ...]:
        """Projections the frontier searches, unless listed: those the basis allows.

        Descriptor projections (whose inputs cost a network pass per face and
        an optional extra) are searched by default only when ``--projection``
        is one of them.
        """
        if self.frontier_projections:
            return self.frontier_projections
        return tuple(
            k
            for k in projection_kinds()
            if (self.basis == "background" or not projection_class(k).needs_labels)
            and (projection_class(k).input_kind == "pixels" or k == self.projection)
        )

    @property
    def used_projections(self) -> tuple[str, ...]:
        """Every projection this audit fits: ``--projection`` and, with ``--frontier``, the searched ones."""
        return (self.projection, *(self.searched_projections if self.frontier else ()))

    @property
    def effective_sweep_epsilon(self) -> float:
        """ε of the private curve in the nc and images-per-subject sweeps."""
        if self.sweep_epsilon is not None:
            return float(self.sweep_epsilon)
        if 8.0 in self.epsilons:
            return 8.0
        ordered = sorted(self.epsilons)
        return float(ordered[len(ordered) // 2])

    @property
    def averaging_ks(self) -> tuple[int, ...]:
        """Averaging counts: always 1 (the plain linkage attack), 5 and 20, plus any asked for."""
        return tuple(sorted({1, 5, 20, *self.averaging}))

    @property
    def recogniser_preset(self) -> Preset:
        """The registered preset, with ``hidden`` applied."""
        preset = PRESETS[self.preset]
        if self.hidden is not None and isinstance(preset, MLPPreset):
            return replace(preset, hidden_layer_sizes=(self.hidden,))
        return preset

    def with_(self, **changes: Any) -> AuditConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "min_faces": self.min_faces,
            "normalisation": self.normalisation,
            "mechanism": self.mechanism,
            "epsilons": list(self.epsilons),
            "delta": self.delta,
            "projection": self.projection,
            "components": self.components,
            "repeats": self.repeats,
            "test_size": self.test_size,
            "preset": self.preset,
            "hidden": self.hidden,
            "basis": self.basis,
            "background_faces": list(self.background_faces_range),
            "mirror": self.mirrored(self.projection),
            "seed": self.seed,
            "secure_noise": self.secure_noise,
            "sweep_components": list(self.sweep_components),
            "sweep_images": list(self.sweep_images),
            "sweep_epsilon": self.effective_sweep_epsilon,
            "subset_sizes": list(self.subset_sizes),
            "averaging": list(self.averaging_ks),
            "frontier": self.frontier,
            "frontier_epsilons": list(self.frontier_epsilons),
            "frontier_components": list(self.frontier_components),
            "frontier_projections": list(self.searched_projections),
            "bystander": self.bystander,
            **({"bystander_label_epsilons": list(self.bystander_label_epsilons)} if self.bystander else {}),
            "site_keys": self.site_keys,
            "open_set": self.open_set,
            **(
                {
                    "open_set_enrolled": self.open_set_enrolled,
                    "open_set_enrol_images": self.open_set_enrol_images,
                    "open_set_probes": self.open_set_probes,
                    "open_set_strangers": self.open_set_strangers,
                    "open_set_public_max_images": self.open_set_public_max_images,
                    "open_set_calibration_images": self.open_set_calibration_images,
                    "open_set_background_rare": self.open_set_background_rare,
                    "open_set_background_frequent": self.open_set_background_frequent,
                    "open_set_basis": self.open_set_basis,
                    "open_set_components": list(self.open_set_dimensions),
                    "open_set_label_epsilons": list(self.open_set_label_epsilons),
                    "open_set_label_draws": self.open_set_label_draws,
                    "open_set_fpir": list(self.open_set_fpir),
                    "open_set_far": self.open_set_far,
                    "open_set_presets": list(self.open_set_presets),
                }
                if self.open_set
                else {}
            ),
        }
