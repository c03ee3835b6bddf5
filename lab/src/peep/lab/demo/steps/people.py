"""The demo's first step: who is enrolled, who is a stranger and who is the public background, from LFW."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from peep.lab.demo.options import DemoOptions
from peep.lab.demo.scenario import Scenario, choose_people


@dataclass(frozen=True)
class People:
    """The run's scenario and the LFW people it was chosen from.

    Attributes
    ----------
    scenario : Scenario
        Who is enrolled (with which photos), whose held-out photos the cameras see, who the strangers and the
        background population are.
    lfw_names : list of str
        Every LFW person (folder names).
    lfw_counts : dict of str -> int
        How many photos each LFW person has.
    """

    scenario: Scenario
    lfw_names: list[str]
    lfw_counts: dict[str, int]


def choose_from_lfw(opts: DemoOptions) -> People:
    """Choose the run's people from LFW (seeded by ``--seed``), keeping only photos a desk finds a face in."""
    import cv2
    from peep.core.imaging import primary_face
    from peep.edge.config import DetectorConfig
    from peep.edge.detection import build_detector
    from peep.edge.testing import lfw_people
    from peep.server.datasets import ensure_lfw

    people = lfw_people(ensure_lfw(opts.data_home).parent.parent)
    # The same detector settings the demo's edge agents run with.
    detector = build_detector(DetectorConfig())

    def usable(path: Path) -> bool:
        # The enrolment desk needs a face in every photo it is given; read the
        # photo as its folder source does (colour, then the detector's gray).
        img = cv2.imread(str(path), cv2.IMREAD_COLOR)
        return img is not None and primary_face(detector.detect(img), img.shape) is not None

    scenario = choose_people(
        people,
        n_subjects=opts.subjects,
        enrol_images=opts.enrol_images,
        probe_images=opts.probe_images,
        n_strangers=opts.strangers,
        seed=opts.seed,
        usable=usable,
    )
    return People(scenario=scenario, lfw_names=list(people), lfw_counts={n: len(p) for n, p in people.items()})
