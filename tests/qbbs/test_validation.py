"""Unknown traits, NaN and out-of-range values are rejected with specific errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from peep.server.qbbs import (
    ParzenScoreModel,
    QbbsConfig,
    QbbsError,
    TraitSpec,
    TraitValueError,
    UnknownSubjectError,
    UnknownTraitError,
    load_qbbs_config,
)

BAD_VALUES = [
    (math.nan, "finite"),
    (math.inf, "finite"),
    (-math.inf, "finite"),
    (17.0, r"declared range \[18, 90\]"),
    (90.5, r"declared range \[18, 90\]"),
    ("42", "number"),
    (True, "number"),
    (None, "number"),
]


@pytest.mark.parametrize(("value", "match"), BAD_VALUES)
def test_enrolment_rejects_bad_values_and_writes_nothing(make_module, value, match):
    module = make_module(enrol=False)
    with pytest.raises(TraitValueError, match=match):
        module.enrol("frank", {"height": 180.0, "age": value})
    assert module.enrolled_traits("frank") == []  # all-or-nothing
    assert isinstance(TraitValueError("x"), ValueError)


@pytest.mark.parametrize(("value", "match"), BAD_VALUES)
def test_verification_rejects_bad_observed_values_before_spending(make_module, value, match):
    module = make_module()
    module.use_face_model(ParzenScoreModel().fit([0.0, -1.0, -0.5], [-4.0, -6.0, -5.0]))
    with pytest.raises(TraitValueError, match=match):
        module.verify(claimed_subject="bob", face_score=-0.2, observed={"age": value})
    assert module.odometer("bob").epsilon_spent == 0.0


def test_binary_traits_enrol_as_zero_or_one_and_observe_as_a_probability(make_module):
    # fixed weights: a calibration on these perfectly separating face scores would not query gender at all
    module = make_module(weights={"face": 0.6, "age": 0.1, "gender": 0.1, "height": 0.1, "weight": 0.1})
    module.use_face_model(ParzenScoreModel().fit([0.0, -1.0, -0.5], [-4.0, -6.0, -5.0]))
    with pytest.raises(TraitValueError, match="0 or 1"):
        module.enrol("frank", {"gender": 0.5})
    r = module.verify(claimed_subject="bob", face_score=-0.2, observed={"gender": 0.8})
    assert r.traits[0].trait == "gender"
    with pytest.raises(TraitValueError, match=r"\[0, 1\]"):
        module.verify(claimed_subject="bob", face_score=-0.2, observed={"gender": 1.5})


@pytest.mark.parametrize("trait", ["shoe_size", "AGE", "", "face"])
def test_unknown_traits_are_rejected_everywhere(make_module, trait):
    module = make_module()
    module.use_face_model(ParzenScoreModel().fit([0.0, -1.0, -0.5], [-4.0, -6.0, -5.0]))
    with pytest.raises(UnknownTraitError, match="this deployment's traits"):
        module.enrol("bob", {trait: 1.0})
    with pytest.raises(UnknownTraitError):
        module.query("bob", trait)
    with pytest.raises(UnknownTraitError):
        module.verify(claimed_subject="bob", face_score=-0.2, observed={trait: 1.0})
    assert module.odometer("bob").epsilon_spent == 0.0


def test_unknown_subjects_and_bad_ids(make_module):
    module = make_module()
    with pytest.raises(UnknownSubjectError, match="no enrolled 'age'"):
        module.query("zoe", "age")
    with pytest.raises(QbbsError, match="subject"):
        module.query("a/b", "age")
    with pytest.raises(QbbsError, match="at least one"):
        module.enrol("zoe", {})
    assert module.odometer("zoe").epsilon_spent == 0.0
    module.erase("alice")
    with pytest.raises(UnknownSubjectError):
        module.query("alice", "age")


def test_deployments_can_add_traits(make_module):
    shoe = TraitSpec(unit="EU", lower=30.0, upper=50.0, width=1.0)
    module = make_module(
        enrol=False,
        traits={"age": QbbsConfig().traits["age"], "shoe_size": shoe},
        weights={"face": 0.7, "age": 0.2, "shoe_size": 0.1},
        epsilon=1e7,
        epsilon_cap=1e9,
    )
    module.enrol("kim", {"age": 30.0, "shoe_size": 41.0})
    assert module.query("kim", "shoe_size").value == pytest.approx(41.0, abs=1e-3)
    with pytest.raises(UnknownTraitError):
        module.query("kim", "height")


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"lower": 10.0, "upper": 5.0}, "upper"),
        ({"lower": 0.0, "upper": math.inf}, "finite"),
        ({"width": 0.0}, "width"),
        ({"kind": "binary"}, "binary"),
    ],
)
def test_trait_specs_are_validated(bad, match):
    base = {"unit": "u", "lower": 0.0, "upper": 10.0, "width": 1.0}
    with pytest.raises(ValueError, match=match):
        TraitSpec(**(base | bad))


def test_config_file_errors_name_the_key(tmp_path):
    p = tmp_path / "qbbs.toml"
    p.write_text("[qbbs]\nepsilon = -1\nstore_path = 'data/qbbs.sqlite'\nbogus = 1\n")
    with pytest.raises(ValueError, match=r"qbbs\.epsilon: .*, received -1\n.*qbbs\.bogus: unknown key"):
        load_qbbs_config(p)
    p.write_text("[qbbs]\nepsilon = 2.0\nstore_path = 'data/qbbs.sqlite'\n")
    cfg = load_qbbs_config(p)
    assert cfg.epsilon == 2.0 and cfg.store_path == tmp_path / "data" / "qbbs.sqlite"
    # weights and threshold unset: both calibrated; the fallback weights (for a fixed threshold) sum to 1
    assert cfg.weights is None and cfg.threshold is None and cfg.calibrated and cfg.target_far == 0.01
    assert np.isclose(sum(cfg.fixed_weights().values()), 1.0) and set(cfg.fixed_weights()) == {"face", *cfg.traits}
