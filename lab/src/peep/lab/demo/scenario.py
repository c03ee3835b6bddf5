"""Who appears where in the demo: people, splits and the videos the cameras watch.

Everything here is decided by a seed, so a demo run is reproducible up to
the privacy noise (which always comes from the secure sampler).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Appearance:
    """One person walking past one camera (frames ``start <= f < stop``); at a door, whom they claim to be."""

    person: str
    enrolled: bool
    image: Path
    start: int
    stop: int
    claim: str | None = None


@dataclass
class CameraScript:
    """The video one camera plays and who is in which frames."""

    device_id: str
    transport: str  # "grpc" or "mqtt"
    video: Path
    n_frames: int
    appearances: list[Appearance] = field(default_factory=list)
    #: A rendered scene (``<scene>.gt.jsonl`` beside the video): several people at once, whose faces the
    #: ground truth places; None for a composed video (one person at a time, :meth:`who`).
    scene: Path | None = None

    def who(self, frame_index: int) -> Appearance | None:
        for a in self.appearances:
            if a.start <= frame_index < a.stop:
                return a
        return None


@dataclass
class Scenario:
    """People and images of one demo run.

    Attributes
    ----------
    enrolled : dict of person -> enrolment image paths
    probes : dict of person -> held-out image paths (never used for enrolment)
    strangers : dict of person -> images of never-enrolled people
    background : list of person names whose faces build the bundle and teach "unknown"
    """

    enrolled: dict[str, list[Path]]
    probes: dict[str, list[Path]]
    strangers: dict[str, list[Path]]
    background: list[str]


def choose_people(
    people: dict[str, list[Path]],
    *,
    n_subjects: int,
    enrol_images: int,
    probe_images: int,
    n_strangers: int,
    seed: int,
    usable: Callable[[Path], bool] = lambda _p: True,
) -> Scenario:
    """Split LFW people into enrolled subjects, strangers and a background population.

    Subjects come from people with at least ``enrol_images + probe_images``
    usable images; strangers and the background population from LFW's 5-9
    image people, disjoint from each other, so "unknown" is tested on faces
    the system has never seen in any role. ``usable(path)`` says whether a
    photo shows a detectable face (checked only for photos that get a role).
    """
    rng = np.random.default_rng(seed)
    need = enrol_images + probe_images
    frequent = sorted(p for p, imgs in people.items() if len(imgs) >= max(need, 20))
    rare = sorted(p for p, imgs in people.items() if 5 <= len(imgs) <= 9)
    if len(frequent) < n_subjects:
        raise ValueError(
            f"--subjects: expected at most {len(frequent)} (people with >= {need} images), received {n_subjects}"
        )
    if len(rare) < n_strangers + 140:
        raise ValueError(
            f"strangers: expected at least {n_strangers + 140} people with 5-9 images "
            f"(strangers + a background population), found {len(rare)}"
        )
    enrolled: dict[str, list[Path]] = {}
    probes: dict[str, list[Path]] = {}
    for person in (frequent[i] for i in rng.permutation(len(frequent))):
        if len(enrolled) == n_subjects:
            break
        imgs = [people[person][i] for i in rng.permutation(len(people[person]))]
        good: list[Path] = []
        for img in imgs:
            if usable(img):
                good.append(img)
                if len(good) == need:
                    break
        if len(good) == need:
            enrolled[person], probes[person] = good[:enrol_images], good[enrol_images:]
    if len(enrolled) < n_subjects:
        raise ValueError(f"--subjects: only {len(enrolled)} people have {need} photos with a detectable face")
    enrolled = dict(sorted(enrolled.items()))
    probes = dict(sorted(probes.items()))
    shuffled = [rare[i] for i in rng.permutation(len(rare))]
    strangers: dict[str, list[Path]] = {}
    taken = 0
    for person in shuffled:
        if len(strangers) == n_strangers:
            break
        taken += 1
        first = next((img for img in people[person] if usable(img)), None)
        if first is not None:
            strangers[person] = [first]
    strangers = dict(sorted(strangers.items()))
    background = sorted(shuffled[taken:])
    return Scenario(enrolled=enrolled, probes=probes, strangers=strangers, background=background)


def camera_scripts(
    scenario: Scenario,
    out_dir: Path,
    *,
    device_ids: list[str],
    transports: list[str],
    visible_frames: int,
    gap_frames: int,
    seed: int,
) -> list[CameraScript]:
    """Deal every probe and stranger image to a camera as one appearance each."""
    rng = np.random.default_rng(seed + 1)
    items: list[tuple[str, bool, Path]] = [(p, True, img) for p, imgs in scenario.probes.items() for img in imgs]
    items += [(p, False, img) for p, imgs in scenario.strangers.items() for img in imgs[:1]]
    order = rng.permutation(len(items))
    scripts = [
        CameraScript(device_id=d, transport=t, video=out_dir / f"{d}.mp4", n_frames=0)
        for d, t in zip(device_ids, transports, strict=True)
    ]
    for k, i in enumerate(order):
        person, enrolled, img = items[int(i)]
        cam = scripts[k % len(scripts)]
        start = cam.n_frames + gap_frames
        cam.appearances.append(
            Appearance(person=person, enrolled=enrolled, image=img, start=start, stop=start + visible_frames)
        )
        cam.n_frames = start + visible_frames
    for cam in scripts:
        cam.n_frames += gap_frames
    return scripts


def door_script(
    scenario: Scenario, out_dir: Path, *, device_id: str, visible_frames: int, gap_frames: int, seed: int
) -> CameraScript:
    """The door camera's video: each enrolled person's held-out photos, each shown twice at the door.

    Once with a genuine claim (the badge of the person shown) and once with an impostor's (the badge of
    another enrolled subject, drawn at random), in a shuffled order.
    """
    rng = np.random.default_rng(seed + 11)
    subjects = list(scenario.probes)
    items: list[tuple[str, Path, str]] = []
    for person, imgs in scenario.probes.items():
        others = [s for s in subjects if s != person]
        for img in imgs:
            items.append((person, img, person))
            if others:
                items.append((person, img, str(rng.choice(others))))
    script = CameraScript(device_id=device_id, transport="grpc", video=out_dir / f"{device_id}.mp4", n_frames=0)
    for i in rng.permutation(len(items)):
        person, img, claim = items[int(i)]
        start = script.n_frames + gap_frames
        script.appearances.append(Appearance(person=person, enrolled=True, image=img, start=start,
                                             stop=start + visible_frames, claim=claim))  # fmt: skip
        script.n_frames = start + visible_frames
    script.n_frames += gap_frames
    return script


def compose_camera_video(script: CameraScript, *, fps: float, seed: int, amplitude: float = 60.0) -> None:
    """Write the camera's video: each appearance walks across the frame (``amplitude`` pixels either way)."""
    from peep.edge.testing import FaceTrack, compose_video

    tracks = [
        FaceTrack(
            image=a.image,
            start=a.start,
            stop=a.stop,
            x0=220.0,
            y0=120.0 + 20 * (i % 3),
            amplitude=amplitude,
            period_frames=max(4.0, 2.0 * (a.stop - a.start)),
            phase=float(i),
        )
        for i, a in enumerate(script.appearances)
    ]
    compose_video(os.fspath(script.video), tracks, n_frames=script.n_frames, fps=fps, seed=seed, face_size=200)


def link_folder(paths: list[Path], folder: Path) -> Path:
    """A folder of symlinks to ``paths`` (an enrolment source; images are never copied)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(paths):
        link = folder / f"{i:03d}{p.suffix}"
        if not link.exists():
            link.symlink_to(p.resolve())
    return folder
