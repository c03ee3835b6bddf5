"""The synthetic height and weight of simulated people: a public adult population model by gender.

LFW has no anthropometry, so evaluation subjects (``peep qbbs evaluate``,
``peep demo``) get stature and weight drawn with a fixed seed from adult
population distributions by (estimated) gender, and the hosted module's
calibration (:mod:`peep.server.qbbs.calibration`) draws simulated people from
the same model unless ``[qbbs.population]`` declares the site's own. Means:
US adults aged 20 and over, NHANES 2011-2014 -- Fryar CD, Gu Q, Ogden CL,
Flegal KM, "Anthropometric reference data for children and adults: United
States, 2011-2014", NCHS Vital Health Stat 3(39), 2016 (men 175.9 cm /
88.8 kg, women 161.9 cm / 76.4 kg). The standard deviations (height 7.4 /
6.8 cm, weight 19 / 20 kg, log-normal weight) and the height-weight
correlation (0.45) are assumptions of typical adult spread, not quoted from
that report. Observations at verification time add synthetic measurement
error (4 cm, 5 kg). Every output labels these traits synthetic.

Served and evaluated alike, so numpy only: the evaluation's age and gender
estimates (:mod:`peep.lab.qbbs.traitdata`) belong to the lab.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from peep.server.config.qbbs import ANTHROPOMETRY


def synthetic_anthropometry(
    gender: NDArray[np.float64], *, seed: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Draw (height cm, weight kg) per subject from the gender's population distribution.

    Parameters
    ----------
    gender : ndarray of shape (n_subjects,)
        0 = female, 1 = male.
    seed : int
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x51A7]))
    n = gender.size
    z1, z2 = rng.standard_normal(n), rng.standard_normal(n)
    r = ANTHROPOMETRY["height_weight_correlation"]
    height = np.empty(n)
    weight = np.empty(n)
    for g, key in ((0, "female"), (1, "male")):
        p = ANTHROPOMETRY[key]
        m = gender == g
        height[m] = p["height_mean_cm"] + p["height_sd_cm"] * z1[m]
        s2 = np.log1p((p["weight_sd_kg"] / p["weight_mean_kg"]) ** 2)
        mu = np.log(p["weight_mean_kg"]) - s2 / 2
        weight[m] = np.exp(mu + np.sqrt(s2) * (r * z1[m] + np.sqrt(1 - r * r) * z2[m]))
    return height, weight
