"""``peep audit`` end to end through the CLI (main(argv)), on reduced settings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from peep.lab.audit.schema import validate_audit
from peep.server.cli import main


def _base(data_home: str, out: Path) -> list[str]:
    return ["audit", "--dataset", "lfw", "--data-home", data_home, "--out", str(out), "--no-progress"]


def _check_outputs(out: Path) -> dict:
    doc = json.loads((out / "audit.json").read_text())
    validate_audit(doc)
    report = (out / "report.html").read_text()
    assert doc["plots"], "no plots recorded"
    for name in doc["plots"].values():
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    # self-contained: every plot embedded, nothing loaded from elsewhere
    assert report.count("data:image/png;base64,") == len(doc["plots"])
    assert not re.search(r"""(src|href)=["'](?!data:)""", report)
    return doc


@pytest.mark.slow
def test_cli_end_to_end_with_frontier(data_home: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "audit"
    argv = [
        *_base(data_home, out),
        "--mechanism",
        "peep",
        "--epsilons",
        "2,16",
        "--components",
        "16",
        "--repeats",
        "2",
        "--hidden",
        "32",
        "--sweep-components",
        "8,16",
        "--sweep-images",
        "10",
        "--jobs",
        "2",
        "--frontier",
        "--frontier-epsilons",
        "64,1024",
        "--frontier-components",
        "8,16",
        "--no-bystander",  # measured by test_cli_bystander_section
    ]
    assert main(argv) == 0
    doc = _check_outputs(out)
    assert set(doc["plots"]) == {
        "utility_vs_epsilon",
        "privacy_vs_epsilon",
        "linkage_subsets",
        "utility_vs_components",
        "utility_vs_images",
        "reconstruction_grid",
        "frontier",
    }
    fr = doc["frontier"]
    assert [p["epsilon_vector"] for p in fr["points"]] == [64.0, 1024.0]
    for p in fr["points"]:
        # calibrated to the requested per-vector ε, best and paper mode alike
        assert p["best"]["epsilon_vector"] == pytest.approx(p["epsilon_vector"], rel=1e-6)
        assert p["paper_mode"]["epsilon_vector"] == pytest.approx(p["epsilon_vector"], rel=1e-6)
        assert p["paper_mode"]["configuration"] == {
            "projection": "eigenfaces",
            "mechanism": "peep",
            "n_components": 16,
            "bounds": "bundle",
        }
        assert p["best"]["configuration"]["mechanism"] in fr["searched"]["mechanisms"]
        assert "linkage" in p["best"] and "averaging" in p["best"]
    # (8, 16 nc) x the mechanisms searched at each ε (privunit stops at ε = 500) x 2 bounds
    # (the unit-sphere kinds use no bounds: searched once)
    from peep.core.domains import domain
    from peep.core.mechanisms import mechanism_class

    def searched(eps: float) -> int:
        kinds = [mechanism_class(k) for k in fr["searched"]["mechanisms"] if mechanism_class(k).max_epsilon >= eps]
        return sum(2 if domain(c.domain).uses_bounds else 1 for c in kinds)

    assert fr["searched"]["projections"] == ["eigenfaces"]  # --basis train: Fisherfaces would not be honest
    assert searched(64.0) > searched(1024.0) >= 8
    assert len(fr["selection"]["points"]) == 2 * (searched(64.0) + searched(1024.0))
    stdout = capsys.readouterr().out
    assert "no privacy: accuracy" in stdout and "frontier" in stdout
    assert doc["command"][:2] == ["peep", "audit"]


@pytest.mark.slow
def test_cli_folder_dataset_secure_sampler(lfw_folder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder-per-identity PATH, the secure sampler and a second mechanism."""
    monkeypatch.setenv("PEEP_CACHE_DIR", str(tmp_path / "cache"))  # keep the shared face cache clean
    folder = lfw_folder({"Colin_Powell": 14, "Tony_Blair": 14, "Gerhard_Schroeder": 14})
    out = tmp_path / "audit"
    argv = [
        "audit",
        "--dataset",
        str(folder),
        "--min-faces",
        "10",
        "--out",
        str(out),
        "--no-progress",
        "--mechanism",
        "laplace-l1",
        "--epsilons",
        "100",
        "--components",
        "8",
        "--repeats",
        "1",
        "--preset",
        "reference",
        "--hidden",
        "16",
        "--sweep-components",
        "none",
        "--sweep-images",
        "none",
        "--secure-noise",
        "--jobs",
        "1",
        "--no-bystander",  # its strangers would be detected afresh in this test's empty face cache
    ]
    assert main(argv) == 0
    doc = _check_outputs(out)
    assert doc["bystander"] is None and doc["bystander_setup"] is None
    assert "bystander" not in doc["plots"]
    assert "--no-bystander" in doc["command"]
    assert doc["dataset"]["n_subjects"] == 3
    assert doc["protocol"]["preset"] == "reference" and doc["config"]["hidden"] == 16
    assert doc["command"][doc["command"].index("--preset") + 1] == "reference"
    assert doc["sampler"] == {**doc["sampler"], "name": "secure", "is_secure": True, "seeded_noise_feature": False}
    r = doc["results"][0]
    assert r["epsilon_vector"] == pytest.approx(100.0)
    assert r["epsilon_coordinate"] <= 100.0
    assert doc["linkage_subsets_skipped"]  # only 3 identities: no sets of 5 or 10
    assert "utility_vs_components" not in doc["plots"]


@pytest.mark.slow
def test_cli_bystander_section(data_home: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's appearances: linked from kept templates (keep = all); no template under keep = none."""
    out = tmp_path / "audit"
    argv = [
        *_base(data_home, out),
        "--mechanism",
        "privunit",
        "--projection",
        "fisherfaces",
        "--basis",
        "background",
        "--background-max-faces",
        "9",
        "--components",
        "16",
        "--epsilons",
        "4,64",
        "--repeats",
        "1",
        "--hidden",
        "16",
        "--sweep-components",
        "none",
        "--sweep-images",
        "none",
        "--jobs",
        "2",
    ]
    assert main(argv) == 0
    doc = _check_outputs(out)
    assert "bystander" in doc["plots"]
    by = doc["bystander"]
    assert [b["epsilon"] for b in by] == [4.0, 64.0]
    setup = doc["bystander_setup"]
    assert setup["population"]["max_faces"] == 9
    assert (
        sum(setup["groups"][g][0] for g in ("strangers", "calibration", "public")) == setup["population"]["n_subjects"]
    )
    for b in by:
        # privunit: the parameter is the per-template ε (the exact guarantee may be a hair below it)
        assert b["epsilon_vector"] == pytest.approx(b["epsilon"], rel=1e-3) and b["epsilon_vector"] <= b["epsilon"]
        assert b["keep_none"]["templates_kept"] == 0
        assert b["keep_all"]["templates_kept"] == b["n_appearances"] == setup["appearances"]["strangers"][0]
        assert b["chance_precision"] == pytest.approx(b["n_same_pairs"] / b["n_pairs"])
        best = b["keep_all"]["best"]
        scores = b["keep_all"]["methods"][best["method"]]
        assert best["f1"] == scores["f1"] == max(m["f1"] for m in b["keep_all"]["methods"].values())
        events = b["keep_none"]["events"]
        assert events["f1"] == b["keep_none"]["methods"][events["method"]]["f1"]
        assert events["chance_precision"] == b["chance_precision"]
        assert 0.0 <= b["keep_recognised"]["share"] <= 1.0
    # more ε links better: at ε = 64 the kept templates give the strangers away
    lo, hi = by
    assert hi["keep_all"]["best"]["f1"] > lo["keep_all"]["best"]["f1"]
    assert hi["keep_all"]["best"]["f1"] > 2 * hi["chance_f1"]
    assert hi["keep_all"]["methods"]["parrot_plda"]["pair_auc"] > 0.8
    report = (out / "report.html").read_text()
    assert "Bystanders" in report and "recognition.events_days" in report
    assert "bystanders" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--mechanism", "peep", "--epsilons", "-1"], "--epsilons"),
        (["--mechanism", "peep", "--components", "5000"], "--components"),
        (["--mechanism", "peep", "--repeats", "0"], "--repeats"),
        (["--mechanism", "gaussian-l2", "--delta", "2"], "--delta"),
        (["--mechanism", "peep", "--min-faces", "1000"], "--dataset"),
    ],
)
def test_cli_usage_errors_exit_2_naming_the_option(
    data_home: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    assert main([*_base(data_home, tmp_path / "x"), *extra]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "x" / "audit.json").exists()


def test_cli_rejects_malformed_lists(data_home: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*_base(data_home, tmp_path), "--mechanism", "peep", "--epsilons", "1,x"])
    assert exc.value.code == 2


def test_fisherfaces_need_the_background_basis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """LDA on the audited people would be neither public nor honest: --basis train is refused by name."""
    argv = ["audit", "--dataset", "lfw", "--projection", "fisherfaces", "--mechanism", "privunit", "--epsilons", "8"]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--basis" in err and "fisherfaces" in err and "'background'" in err


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"dataset": "lfw", "min_faces": 100}, (5, 99)),
        ({"dataset": "lfw", "min_faces": 20}, (5, 19)),
        ({"dataset": "/some/folder", "min_faces": 10}, (5, None)),
        ({"dataset": "lfw", "min_faces": 100, "background_max_faces": 9}, (5, 9)),
    ],
)
def test_background_is_every_lfw_identity_that_is_not_audited(small_cfg, changes, expected) -> None:
    assert small_cfg.with_(basis="background", **changes).background_faces_range == expected


def test_background_max_faces_must_stay_below_the_audited_people(small_cfg) -> None:
    from peep.lab.audit.config import AuditConfigError

    with pytest.raises(AuditConfigError, match="--background-max-faces"):
        small_cfg.with_(basis="background", background_max_faces=100)


def test_a_folder_background_excludes_the_audited_identities(data_home: str, tmp_path: Path, small_cfg) -> None:
    from peep.lab.audit.execution import load_audit_data

    src = Path(data_home) / "lfw_home" / "lfw_funneled"
    folder = tmp_path / "faces"
    people = ("Ahmed_Chalabi", "Ai_Sugiyama", "Al_Gore")  # LFW people with 5-9 images
    for person in people:
        (folder / person).mkdir(parents=True)
        for f in sorted((src / person).glob("*.jpg"))[:5]:
            (folder / person / f.name).symlink_to(f)
    cfg = small_cfg.with_(dataset=str(folder), min_faces=4, basis="background", background_max_faces=9)
    data = load_audit_data(cfg)
    assert data.background is not None and data.background_labels is not None
    assert data.background_desc["excluded_audited_identities"] == len(people)
    assert data.background.shape[0] == data.background_labels.shape[0]


@pytest.mark.slow
def test_background_basis_is_shared_by_all_splits(lfw_background, small_cfg) -> None:
    from peep.lab.audit.execution import load_audit_data, make_context

    cfg = small_cfg.with_(basis="background", components=16, background_max_faces=9)
    data = load_audit_data(cfg)
    assert data.background is not None and data.background.shape[0] == lfw_background.n_images
    a, _ = make_context(data, cfg, 0, n_components=16, with_clean=False)
    b, _ = make_context(data, cfg, 1, n_components=16, with_clean=False)
    assert a.basis.n_fit == lfw_background.n_images
    # fitted on people disjoint from the audited ones: the same public bounds whatever the split
    assert (a.train_idx != b.train_idx).any()
    assert (a.basis.bounds.upper == b.basis.bounds.upper).all()
