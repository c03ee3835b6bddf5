"""audit.json follows its documented schema and carries the fields the audit's readers rely on."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from peep.lab.audit.schema import AUDIT_SCHEMA, AuditSchemaError, validate_audit

ISSUE_RESULT_KEYS = (
    "epsilon",
    "epsilon_vector",
    "accuracy",
    "weighted_f1",
    "weighted_precision",
    "weighted_recall",
    "reconstruction_ssim",
    "reconstruction_reid",
    "linkage",
    "chance",
    "averaging",
    "membership_auc",
)


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(AUDIT_SCHEMA)


def test_written_audit_validates_and_holds_the_required_fields(tiny_audit) -> None:
    _, out, _ = tiny_audit
    doc = json.loads((out / "audit.json").read_text())
    validate_audit(doc)
    assert json.loads((out / "audit.schema.json").read_text()) == json.loads(json.dumps(AUDIT_SCHEMA))
    assert set(doc["dataset"]) >= {"n_subjects", "n_images"}
    assert doc["dataset"]["n_subjects"] == 5
    assert doc["mechanism"]["kind"] == "peep"
    assert doc["components"] == 16
    assert set(doc["no_privacy"]) >= {"accuracy", "weighted_f1"}
    assert doc["sampler"]["name"] == "seeded" and doc["sampler"]["seeded_noise_feature"] is True
    assert [r["epsilon"] for r in doc["results"]] == [2.0, 16.0]
    for r in doc["results"]:
        for key in ISSUE_RESULT_KEYS:
            assert key in r, key
        assert set(r["linkage"]) >= {"knn", "svm", "logreg", "mlp", "max"}
        assert set(r["averaging"]) >= {"1", "5", "20"}
        # paper mode: per-vector ε is nc times the per-coordinate ε, shown side by side
        assert r["epsilon_coordinate"] == pytest.approx(r["epsilon"])
        assert r["epsilon_vector"] == pytest.approx(16 * r["epsilon"])
        assert r["n_repeats"] == 2
        assert r["std"]["accuracy"] >= 0.0
        # mean over splits of each split's best adversary: at least the best mean
        assert r["linkage"]["max"] >= max(r["linkage"][a] for a in ("knn", "svm", "logreg", "mlp", "bayes"))
    # more noise never makes the best attack or the recogniser much better
    lo, hi = doc["results"]
    assert hi["accuracy"] >= lo["accuracy"] - 0.05
    assert hi["linkage"]["max"] >= lo["linkage"]["max"] - 0.05
    assert [p["value"] for p in doc["sweeps"]["components"]] == [8, 16]
    assert [p["value"] for p in doc["sweeps"]["images_per_subject"]] == [10]
    assert doc["sweeps"]["images_per_subject"][0]["images_per_subject_min"] == 10
    assert doc["frontier"] is None
    assert [b["epsilon"] for b in doc["bystander"]] == [2.0, 16.0]
    for b in doc["bystander"]:
        assert b["keep_none"]["templates_kept"] == 0
        assert set(b["keep_all"]["methods"]) == {"cosine", "parrot_lda", "parrot_plda", "combined"}
        assert b["keep_all"]["best"]["method"] in b["keep_all"]["methods"]
        assert b["n_repeats"] == 2 and len(b["per_repeat"]["keep_all_f1"]) == 2
        assert b["epsilon_vector"] == pytest.approx(16 * b["epsilon"])
    assert doc["timing"]["wall_seconds"] > 0 and doc["timing"]["cpu_seconds"] > 0


@pytest.mark.slow
def test_schema_accepts_a_run_without_the_bystander_section(tiny_audit) -> None:
    doc = copy.deepcopy(tiny_audit[0].data)
    doc["bystander"] = doc["bystander_setup"] = None
    validate_audit(doc)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d["results"][0]["linkage"].pop("max"), "results/0/linkage"),
        (lambda d: d["results"][0].__setitem__("accuracy", 1.5), "results/0/accuracy"),
        (lambda d: d["dataset"].pop("n_subjects"), "dataset"),
        (lambda d: d["results"][1]["averaging"].pop("20"), "results/1/averaging"),
        (lambda d: d.__setitem__("results", []), "results"),
        (lambda d: d["bystander"][0]["keep_none"].__setitem__("templates_kept", 3), "bystander"),
        (lambda d: d["bystander"][1]["keep_all"].pop("best"), "bystander"),
        (lambda d: d["bystander"][0]["keep_all"]["methods"].pop("parrot_plda"), "bystander"),
        (lambda d: d["bystander"][0].__setitem__("chance_precision", 1.5), "bystander"),
        (lambda d: d.pop("bystander"), r"\(root\): 'bystander'"),
    ],
)
def test_schema_rejects_broken_documents(tiny_audit, mutate, where: str) -> None:
    doc = copy.deepcopy(tiny_audit[0].data)
    mutate(doc)
    with pytest.raises(AuditSchemaError, match=f"audit.json: {where}"):
        validate_audit(doc)
