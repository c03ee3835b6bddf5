"""Template protection under site keys: the metric, the key estimate, and the audit section end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from peep.core.sitekey import SiteKey
from peep.lab.audit.protection import dsys, procrustes
from peep.lab.audit.schema import validate_audit
from peep.server.cli import main


def test_dsys_is_zero_for_one_distribution_and_one_for_disjoint_ones():
    rng = np.random.default_rng(0)
    assert dsys(rng.normal(size=40_000), rng.normal(size=160_000)) < 0.02
    assert dsys(rng.normal(3.0, 0.1, 5000), rng.normal(-3.0, 0.1, 20_000)) == pytest.approx(1.0)
    # Partly overlapping: strictly between, and more separation links more.
    near = dsys(rng.normal(0.5, 1, 20_000), rng.normal(0, 1, 20_000))
    far = dsys(rng.normal(1.5, 1, 20_000), rng.normal(0, 1, 20_000))
    assert 0.05 < near < far < 0.95


def test_procrustes_recovers_a_rotation_from_pairs():
    rng = np.random.default_rng(1)
    q = SiteKey(rng.bytes(32)).rotation(16)
    clean = rng.standard_normal((200, 16))
    np.testing.assert_allclose(procrustes(clean, clean @ q.T), q, atol=1e-10)
    noisy = clean @ q.T + 0.3 * rng.standard_normal((200, 16))
    assert np.linalg.norm(procrustes(clean, noisy) - q) / 4 < 0.1
    # Fewer pairs than dimensions cannot pin it down.
    assert np.linalg.norm(procrustes(clean[:3], (clean @ q.T)[:3]) - q) / 4 > 0.5


@pytest.mark.slow
def test_audit_site_keys_section(data_home: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Keyed accuracy as unkeyed; another key's templates unlinkable; without the key retrieval finds no one."""
    out = tmp_path / "audit"
    argv = ["audit", "--dataset", "lfw", "--data-home", data_home, "--out", str(out), "--no-progress",
            "--mechanism", "privunit", "--projection", "fisherfaces", "--basis", "background", "--background-max-faces",
            "9", "--components", "16", "--epsilons", "64", "--repeats", "2", "--hidden", "16", "--sweep-components",
            "none", "--sweep-images", "none", "--no-bystander", "--site-keys", "2", "--jobs", "2"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads((out / "audit.json").read_text())
    validate_audit(doc)
    assert doc["config"]["site_keys"] == 2 and "--site-keys" in doc["command"]
    (tp,) = doc["template_protection"]
    assert tp["epsilon_vector"] == pytest.approx(64.0, rel=1e-3)
    assert abs(tp["accuracy_keyed"] - tp["accuracy_unkeyed"]) <= 0.05
    assert tp["dsys_same_key"] > 0.3 and tp["dsys_cross_key"] < 0.1, tp
    assert tp["unlinkability_people"] > 100
    assert tp["retrieval_reid_with_key"] > tp["retrieval_reid_without_key"]
    assert tp["retrieval_reid_without_key"] <= 2 * tp["chance"]
    # Renewal: the new key's model answers its own captures, the old key's ones no better than chance allows.
    assert tp["renewal_accuracy_new_key"] > tp["renewal_accuracy_old_key"]
    assert tp["renewal_accuracy_old_key"] <= tp["chance"] + 0.15, tp
    attacks = tp["attacks"]
    assert [p["k"] for p in attacks["insider_procrustes"]] == [1, 2, 4]  # LFW-5: at least one other person left
    assert [p["photos"] for p in attacks["insider_procrustes_photos"]][:3] == [1, 2, 4]
    # Knowing whole people's photos estimates the key well; one photo does not.
    assert attacks["insider_procrustes"][-1]["key_error"] < 0.5 < attacks["insider_procrustes_photos"][0]["key_error"]
    assert 0 <= attacks["public_background"]["groups_matched"] <= 1
    assert attacks["distribution_only"]["reid"] is not None
    assert "template protection" in capsys.readouterr().out


def test_site_keys_need_a_rotation_invariant_mechanism(data_home: str, tmp_path: Path, capsys) -> None:
    argv = ["audit", "--dataset", "lfw", "--data-home", data_home, "--out", str(tmp_path / "o"), "--mechanism", "peep",
            "--site-keys", "2"]  # fmt: skip
    assert main(argv) == 2
    assert "--site-keys: mechanism 'peep': a site key rotates" in capsys.readouterr().err
    assert main([*argv[:-1], "1"]) == 2


@pytest.mark.slow
def test_site_keys_on_a_folder_dataset(lfw_folder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A held-out folder-per-identity dataset gets the same section (no background: no background attack)."""
    monkeypatch.setenv("PEEP_CACHE_DIR", str(tmp_path / "cache"))
    folder = lfw_folder({"Colin_Powell": 14, "Tony_Blair": 14, "Gerhard_Schroeder": 14})
    out = tmp_path / "audit"
    argv = ["audit", "--dataset", str(folder), "--min-faces", "10", "--out", str(out), "--no-progress",
            "--mechanism", "privunit", "--epsilons", "64", "--components", "8", "--repeats", "1", "--hidden", "16",
            "--sweep-components", "none", "--sweep-images", "none", "--jobs", "1", "--no-bystander",
            "--site-keys", "3"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads((out / "audit.json").read_text())
    validate_audit(doc)
    (tp,) = doc["template_protection"]
    assert tp["unlinkability_people"] == 3  # the audited people themselves
    assert [p["k"] for p in tp["attacks"]["insider_procrustes"]] == [1, 2]
    assert tp["attacks"]["public_background"]["reid"] is None
    assert tp["attacks"]["public_background"]["note"] == "no background population"
