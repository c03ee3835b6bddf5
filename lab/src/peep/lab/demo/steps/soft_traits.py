"""The demo's soft-trait step: each subject's age and gender from their photos, height and weight synthetic."""

from __future__ import annotations

import numpy as np
from peep.lab.demo.scenario import Scenario
from peep.lab.demo.steps.context import RunContext
from peep.lab.demo.steps.server import DemoServer
from peep.v1 import qbbs_pb2


class TraitRange:
    """Clips a trait's value to the range the server declares for it, counting what it clipped.

    The synthetic population's tails (a log-normal weight) reach below the adult range now and then
    (33.7 kg with seed 11 stopped the demo); a sensor reports its range's end. Counted in the summary.

    Attributes
    ----------
    clipped : dict of trait -> int
        How many values of each trait were clipped.
    """

    def __init__(self) -> None:
        self.clipped: dict[str, int] = {}

    def __call__(self, trait: str, value: float) -> float:
        """``value`` clipped to ``trait``'s declared range, which the server refuses values outside of."""
        from peep.server.config.qbbs import DEFAULT_TRAITS

        spec = DEFAULT_TRAITS[trait]
        clipped = min(max(value, spec.lower), spec.upper)
        if clipped != value:
            self.clipped[trait] = self.clipped.get(trait, 0) + 1
        return clipped


def enrol_soft_traits(
    ctx: RunContext, server: DemoServer, scenario: Scenario, in_range: TraitRange
) -> dict[str, dict[str, float]]:
    """Enrol each subject's soft traits with QBBS; returns them, by subject.

    Age and gender are estimated from the subject's enrolment photos; height and weight are synthetic
    (NHANES-based draws seeded by ``--seed``), each clipped by ``in_range``.
    """
    from peep.lab.qbbs.anthropometry import synthetic_anthropometry
    from peep.lab.qbbs.traitdata import estimate_age_gender

    subjects = list(scenario.enrolled)
    paths = [str(p) for s in subjects for p in scenario.enrolled[s]]
    cache = ctx.out / "cache"
    cache.mkdir(exist_ok=True)
    age, p_male = estimate_age_gender(paths, cache_dir=cache)
    k = 0
    mean_age, gender = [], []
    for s in subjects:
        n = len(scenario.enrolled[s])
        mean_age.append(float(np.mean(age[k : k + n])))
        gender.append(1.0 if float(np.mean(p_male[k : k + n])) >= 0.5 else 0.0)
        k += n
    height, weight = synthetic_anthropometry(np.asarray(gender), seed=ctx.opts.seed)
    traits: dict[str, dict[str, float]] = {}
    for i, s in enumerate(subjects):
        t = {
            "age": in_range("age", round(mean_age[i], 1)),
            "gender": gender[i],
            "height": in_range("height", float(height[i])),
            "weight": in_range("weight", float(weight[i])),
        }
        traits[s] = t
        server.qbbs.EnrolSoftTraits(
            qbbs_pb2.EnrolSoftTraitsRequest(
                subject=s, traits=[qbbs_pb2.SoftTraitValue(trait=k2, value=v) for k2, v in t.items()]
            ),
            metadata=server.admin_md,
            timeout=30,
        )
    return traits
