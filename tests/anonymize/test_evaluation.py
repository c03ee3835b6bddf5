"""The evaluation's shortcuts measure what the long way measures: the shared UPBA basis and the sweep point
taken from the method's own run."""

from __future__ import annotations

import numpy as np
import pytest
from peep.lab.anonymize.evaluation import (
    EvalData,
    EvalSettings,
    evaluate_method,
    fit_owner,
    identity_profiles,
    shared_basis,
    split,
    sweep_point,
    sweep_point_of,
)


@pytest.mark.slow
def test_the_sweep_point_at_the_methods_parameters_is_the_methods_run(rng: np.random.Generator) -> None:
    K, n = 6, 12  # 6 identities of 12 noisy faces each, two attributes
    faces = np.repeat(rng.random((K, 62, 47)), n, axis=0) + 0.2 * rng.random((K * n, 62, 47))
    identity = np.repeat(np.arange(K), n)
    tr, te = split(identity, 0.3, 0)
    data = EvalData(
        images=np.clip(faces, 0, 1).astype(np.float32),
        identity=identity,
        attribute=identity % 2,
        attributes={"gender": identity % 2, "age-group": identity % 3},
        train=tr,
        test=te,
        n_identities=K,
    )
    settings = EvalSettings(n_components=8, draws=2)
    owner = fit_owner(data, settings)
    params = {"g": 8, "t": 0.5, "n_estimators": 10}
    basis = shared_basis(data, params, settings)
    result, _ = evaluate_method("upba", params, data, owner, identity_profiles(data, owner.eig), settings, 5, basis)
    assert sweep_point_of(result, settings) == sweep_point(params, data, owner, settings, 5, basis)[0]
