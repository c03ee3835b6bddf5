"""The demo's keys and bundle step: a deployer key pair, a site key, and a signed bundle fitted on public faces.

When the devices decide (``--decide device``), the public faces every device model carries to set its
thresholds are written too.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from peep.core.bundle import ProjectionBundle, load_private_key, write_keypair
from peep.lab.demo.steps.context import HEARTBEAT_S, RunContext
from peep.lab.demo.steps.people import People
from peep.server.progress import Progress


@dataclass(frozen=True)
class Keys:
    """The run's keys.

    Attributes
    ----------
    signing_key, public_key : Path
        The deployer's key pair (``<out>/keys/site.key``, ``site.pub``): it signs the bundle and device models.
    site_key : SiteKey or None
        This run's template key, with which the devices and the administrator rotate every template
        (None: ``--no-site-key``, or a mechanism a rotation would clip).
    site_key_path : Path or None
        Where ``site_key`` is written (``<out>/keys/template.key``); the server never reads it.
    """

    signing_key: Path
    public_key: Path
    site_key: Any | None
    site_key_path: Path | None


@dataclass(frozen=True)
class FittedBundle:
    """The signed bundle and what it was fitted on.

    Attributes
    ----------
    bundle : ProjectionBundle
        The bundle (``<out>/bundle``).
    bundle_dir : Path
        Where it is written.
    background_faces : Dataset
        The public background population's faces, which the administrator enrols to teach "unknown".
    public_faces : tuple of int
        The public faces the bundle was fitted on: images, people.
    calibration : Path or None
        The devices' calibration faces (``--decide device``), else None.
    calibration_population : CalibrationPopulation or None
        Who they are.
    """

    bundle: ProjectionBundle
    bundle_dir: Path
    background_faces: Any
    public_faces: tuple[int, int]
    calibration: Path | None
    calibration_population: Any = None


def make_keys(ctx: RunContext) -> Keys:
    """The deployer's key pair (kept from an earlier run in the same ``--out``) and a new site key."""
    keys = ctx.out / "keys"
    if not (keys / "site.key").exists():
        write_keypair(keys / "site")
    site_key, site_key_path = _make_site_key(ctx, keys)
    return Keys(signing_key=keys / "site.key", public_key=keys / "site.pub", site_key=site_key,
                site_key_path=site_key_path)  # fmt: skip


def _make_site_key(ctx: RunContext, keys: Path) -> tuple[Any | None, Path | None]:
    """A new template key for this run, or none (``--no-site-key``, or a mechanism a rotation would clip)."""
    from peep.core.release import check_keyed_kind
    from peep.core.sitekey import SiteKey

    path = keys / "template.key"
    if path.exists():
        path.unlink()  # the previous run's: each run has its own
    if not ctx.opts.site_key:
        return None, None
    try:
        check_keyed_kind(ctx.opts.mechanism)
    except ValueError as exc:
        ctx.say(f"    no site key: {exc}")
        return None, None
    site_key = SiteKey.generate()
    written = site_key.write(path)
    ctx.say(f"    site key {site_key.key_id} for the devices and the administrator ({path}; the server "
            "never reads it)")  # fmt: skip
    return site_key, written


def fit_bundle(ctx: RunContext, people: People, keys: Keys) -> FittedBundle:
    """Fit and sign the bundle on public faces the demo never uses as a person (and the calibration, if any)."""
    from peep.core.projections import projection_class
    from peep.server.bundles.build import build_bundle
    from peep.server.datasets import load_dataset

    o, scenario = ctx.opts, people.scenario
    input_kind = projection_class(o.projection).input_kind
    encoder: Any = None
    if input_kind != "pixels":
        from peep.server.descriptors import descriptor_encoder

        # The public faces' descriptors from the network the cameras run (cached by image content).
        encoder = descriptor_encoder(input_kind)
        ctx.say(f"    {input_kind} descriptors of the public faces (computed on every core once, then cached)")
    what = "    public faces: finding, cropping" + (f" and describing ({input_kind})" if encoder else "")

    def public_faces(max_faces: int | None, names: list[str]) -> Any:
        # Minutes on a first run: a line every few seconds even off a terminal, so it never looks stuck.
        # Only the people asked for are read: strangers' and enrolled people's photos are never described
        # here (the cameras and the enrolment desk see them).
        with Progress(what, heartbeat=HEARTBEAT_S) as bar:
            return load_dataset(
                "lfw",
                data_home=o.data_home,
                min_faces=5,
                max_faces=max_faces,
                encoder=encoder,
                progress=bar.update,
                people=names,
            )

    calibration = CalibrationPopulation("", "lfw", [])
    background_people = list(scenario.background)
    if o.decide == "device":
        # The devices' thresholds are set on public people the model never saw; the background class keeps
        # the first background_people of the (seeded) background population.
        order = np.random.default_rng(o.seed + 5).permutation(len(background_people))
        shuffled = [background_people[i] for i in order]
        background_people = sorted(shuffled[: o.background_people])
        calibration = calibration_population(ctx, people, shuffled[o.background_people :])
    background = public_faces(min(9, o.public_max_faces or 9), background_people)
    # The bundle is fitted on public faces the demo never uses as a person: the background population
    # and, up to --public-max-faces images each, the LFW people who are neither enrolled nor strangers.
    taken = {n.replace(" ", "_") for n in (*scenario.enrolled, *scenario.strangers)}
    # Nor the calibration people: a projection fitted on their faces places them as it never places a stranger
    # (measured by the audit's open-set section: released FPIR over its target, more so at larger K).
    taken |= {n.replace(" ", "_") for n in calibration.people}
    public = public_faces(o.public_max_faces, [n for n in people.lfw_names if n not in taken])
    bundle_dir = ctx.out / "bundle"
    bundle = build_bundle(
        public,
        n_components=o.n_components,
        signing_key=load_private_key(keys.signing_key),
        out_dir=bundle_dir,
        mechanism_defaults={"kind": o.mechanism, "epsilon": o.epsilon},
        projection=o.projection,
        mirror=o.mirror,
        network=None if encoder is None else encoder.identity,
    )
    ctx.say(
        f"    bundle {bundle.bundle_id}: {bundle.projection_kind}, nc={bundle.n_components}, from "
        f"{public.n_images} faces of {public.n_subjects} public people (none enrolled, none a stranger)"
    )
    path = None
    calibrated: list[str] = []
    if o.decide == "device":
        exclude = [*scenario.enrolled, *scenario.strangers, *background_people]
        path, calibrated = _calibration(ctx, bundle, calibration, exclude)
        # Those chosen whose photo shows a face the desk's detector finds: who set the thresholds.
        calibration = dataclasses.replace(calibration, people=calibrated)
    # Every role's people, by name (LFW's public figures), so that anyone can check that no one has two.
    roles = {
        "enrolled": sorted(scenario.enrolled), "strangers": sorted(scenario.strangers),
        "background": sorted(background_people), "bundle": sorted({str(n) for n in public.target_names}),
        "calibration": calibrated, "calibration_population": calibration.name,
    }  # fmt: skip
    (ctx.out / "people.json").write_text(json.dumps(roles, indent=1) + "\n")
    return FittedBundle(bundle=bundle, bundle_dir=bundle_dir, background_faces=background,
                        public_faces=(public.n_images, public.n_subjects), calibration=path,
                        calibration_population=calibration)  # fmt: skip


@dataclass(frozen=True)
class CalibrationPopulation:
    """Who sets the devices' thresholds.

    Attributes
    ----------
    name : str
        ``"lfw_singles"`` (LFW's one-image people) or ``"lfw"`` (the fallback without them); "" when the
        server decides.
    dataset : str
        What :func:`peep.server.bundles.calibrate.make_calibration` reads: the singles' folder or ``"lfw"``.
    people : list of str
        The people chosen (folder names).
    views : str
        ``"scenes"``: their photos are drawn as the scenes' camera sees a face before they are described
        (``--scenes``); ``""``: the photos as they are.
    """

    name: str
    dataset: str
    people: list[str]
    views: str = ""


def calibration_population(ctx: RunContext, people: People, spare_background: list[str]) -> CalibrationPopulation:
    """LFW's one-image people when present (``calibration_people`` of them, by the seed), else the old rule.

    The singles are in no other role by construction (none is in ``lfw_home/``). Without them, the LFW
    people with 20+ photos who are not enrolled and the background people the background class does not
    keep calibrate, and the demo says how few that is.
    """
    from peep.server.datasets import singles_folder

    o = ctx.opts
    singles = singles_folder(o.data_home)
    if singles is not None:
        names = sorted(p.name for p in singles.iterdir() if p.is_dir())
        pick = np.random.default_rng(o.seed + 6).permutation(len(names))[: o.calibration_people]
        chosen = sorted(names[int(i)] for i in pick)
        ctx.say(f"    calibration population: {len(chosen)} of the {len(names)} one-image public people in "
                f"{singles}")  # fmt: skip
        return CalibrationPopulation("lfw_singles", str(singles), chosen, views="scenes" if o.scenes else "")
    enrolled = {n.replace(" ", "_") for n in people.scenario.enrolled}
    frequent = [n for n, c in people.lfw_counts.items() if c >= 20 and n.replace(" ", "_") not in enrolled]
    chosen = sorted(spare_background) + sorted(frequent)
    ctx.say(
        f"    calibration population: {len(chosen)} public LFW people (no lfw_singles/ beside the LFW copy: "
        f"a 1 % target is resolved only to about 1 in {len(chosen) + 1}; stage it with scripts/stage-lfw.sh)"
    )
    return CalibrationPopulation("lfw", "lfw", chosen)


def _calibration(ctx: RunContext, bundle: ProjectionBundle, population: CalibrationPopulation,
                 exclude: list[str]) -> tuple[Path, list[str]]:  # fmt: skip
    """The public faces every device model carries (clean, unkeyed): what the devices set thresholds on."""
    from peep.server.bundles.calibrate import make_calibration, write_calibration

    o = ctx.opts
    singles = population.name == "lfw_singles"
    dataset, views = population.dataset, None
    if population.views == "scenes":
        # The cameras watch scenes: their thresholds are set on the public photos as such a camera sees a face.
        from peep.lab.scenes.views import write_camera_views

        views = ctx.out / "server" / "calibration-views"
        with Progress("    calibration photos as the scenes' cameras see them", heartbeat=HEARTBEAT_S) as bar:
            dataset = str(write_camera_views(Path(population.dataset), population.people, views, seed=o.seed + 7,
                                             progress=bar.update))  # fmt: skip
    try:
        with Progress("    calibration faces (public people the model never sees)", heartbeat=HEARTBEAT_S) as bar:
            projections, names, domain, kind = make_calibration(
                bundle, dataset, mechanism=o.mechanism, data_home=o.data_home, min_faces=1 if singles else 5,
                people=population.people, exclude=exclude, max_per_person=o.calibration_max_faces,
                progress=bar.update,
            )  # fmt: skip
    finally:
        if views is not None:  # drawn for this run only; the projections below are what the devices carry
            shutil.rmtree(views, ignore_errors=True)
    path = ctx.out / "server" / "calibration.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    cal = write_calibration(path, projections=projections, people=names, bundle_id=bundle.bundle_id,
                            domain=domain, mechanism=kind)  # fmt: skip
    seen = ", drawn as the scenes' cameras see a face" if views is not None else ""
    ctx.say(f"    calibration: {cal.n_faces} clean projections of {cal.n_people} public people ({population.name}"
            f"{seen}), none in the background class, none enrolled, none a stranger")  # fmt: skip
    return path, sorted(set(names))


def keys_and_bundle(ctx: RunContext, people: People) -> tuple[Keys, FittedBundle]:
    """The run's keys, then the bundle they sign (one step of the demo)."""
    keys = make_keys(ctx)
    return keys, fit_bundle(ctx, people, keys)
