"""``peep audit --open-set``: FNIR at fixed FPIR, the server deciding on a release vs a device deciding on its
clean projection and releasing only the label, on the staged LFW faces.

One small audit through the CLI (Fisherfaces K = 16, PrivUnit ε 16, shrinkage LDA, two splits, the label
mechanism at ε 8, 150 of LFW's one-image people calibrating and 150 more as strangers, the enrolment sweep
at 5 releases) serves every check; it takes about half a minute on two cores with the faces cached.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from peep.lab.audit.schema import validate_audit
from peep.server.cli import main

CONTRACT = (
    "mode",
    "epsilon_template",
    "epsilon_label",
    "fpir_target",
    "fpir",
    "fnir",
    "enrolled",
    "probes",
    "strangers",
)
ARGS = [
    "--mechanism", "privunit", "--epsilons", "16", "--projection", "fisherfaces", "--basis", "background",
    "--components", "16", "--repeats", "2", "--hidden", "32", "--sweep-components", "none", "--sweep-images", "none",
    "--subset-sizes", "3", "--averaging", "1", "--no-bystander", "--jobs", "1",
]  # fmt: skip
OPEN_SET = [
    "--open-set", "--open-set-presets", "lda", "--open-set-label-epsilons", "8", "--open-set-calibration-people", "150",
    "--open-set-single-strangers", "150", "--open-set-enrol-sweep", "5",
]  # fmt: skip


def _base(data_home: str, out: Path) -> list[str]:
    return ["audit", "--dataset", "lfw", "--data-home", data_home, "--out", str(out), "--no-progress"]


@pytest.fixture(scope="module")
def open_set_audit(data_home: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("open-set")
    assert main([*_base(data_home, out), *ARGS, *OPEN_SET]) == 0
    return json.loads((out / "audit.json").read_text()), out


def _rows(doc: dict, mode: str, eps_label: float | None) -> dict[float, dict]:
    return {r["fpir_target"]: r for r in doc["open_set"] if r["mode"] == mode and r["epsilon_label"] == eps_label}


@pytest.mark.slow
def test_open_set_rows_carry_the_contract_fields_and_validate(open_set_audit: tuple[dict, Path]) -> None:
    doc, out = open_set_audit
    validate_audit(doc)
    rows = doc["open_set"]
    # server: one row per FPIR target; device: no label noise and ε_label 8, per target
    assert len(rows) == 2 + 2 * 2
    for r in rows:
        assert set(CONTRACT) <= set(r), set(CONTRACT) - set(r)
        assert r["preset"] == "lda" and r["n_components"] == 16 and r["epsilon_template"] == 16.0
        assert (r["enrolled"], r["probes"], r["strangers"], r["single_strangers"]) == (10, 60, 134, 150)
        assert r["enrol_images"] == 20 and 0.0 <= r["fpir_single"] <= 1.0
        assert len(r["per_repeat"]["fnir"]) == len(r["per_repeat"]["fpir"]) == r["n_repeats"] == 2
        assert r["fnir"] == pytest.approx(np.mean(r["per_repeat"]["fnir"]))
    assert {r["epsilon_label"] for r in rows if r["mode"] == "server"} == {None}
    assert {r["epsilon_label"] for r in rows if r["mode"] == "device"} == {None, 8.0}
    # the door: on the server's rows and the device's rows without label noise
    for r in [*_rows(doc, "server", None).values(), *_rows(doc, "device", None).values()]:
        assert 0.0 <= r["gar_at_far"] <= 1.0 and r["far_target"] == 0.001 and r["far"] <= 0.01
        # a probe whose best subject is someone else is a miss at any threshold
        assert r["rank1_miss"] <= r["fnir"]
    setup = doc["open_set_setup"]
    assert setup["decision_preset"]["winner"] == "lda"
    assert len(setup["no_noise"]) == 2 and setup["people"]["strangers"] == [134, 134]
    # where the noise costs FNIR: each part of the served discriminant from the clean model, at every device row's
    # label ε and target; with both parts clean it would be the no-noise model, so neither may be worse than both
    cost = setup["noise_cost"]
    assert sorted((r["mode"], r["epsilon_label"] or 0.0, r["fpir_target"]) for r in cost) == sorted(
        (m, e, t) for m in ("clean_means", "clean_covariance") for e in (0.0, 8.0) for t in (0.01, 0.001)
    )
    assert all(r["epsilon_template"] == 16.0 and r["enrol_images"] == 20 for r in cost)
    # the singles calibrate (found in the data home) and give the second stranger population
    assert setup["calibration"]["population"] == "singles"
    assert setup["people"]["calibration"] == setup["people"]["single_strangers"] == [150, 150]
    assert setup["faces"]["calibration"] == [150, 150]
    assert "lfw_singles" in setup["rule"] and setup["calibration"]["singles"]["in_folder"] == 4069
    # the enrolment sweep: the same rows again, the models learning from 5 releases per person
    sweep = setup["enrolment_sweep"]
    assert {r["enrol_images"] for r in sweep} == {5} and len(sweep) == len(rows)
    assert {r["probes"] for r in sweep} == {60}
    command = doc["command"]
    assert command[command.index("--open-set-label-epsilons") + 1] == "8"
    assert command[command.index("--open-set-calibration") + 1] == "singles"  # resolved, not "auto"
    assert command[command.index("--open-set-enrol-sweep") + 1] == "5"
    assert (out / doc["plots"]["open_set"]).read_bytes()[:4] == b"\x89PNG"
    report = (out / "report.html").read_text()
    assert "Open-set identification: where the decision is made" in report and "Preset for decision mode" in report
    assert "How many photos to enrol" in report and "FPIR, one-image strangers" in report


def test_device_without_label_noise_beats_the_server(open_set_audit: tuple[dict, Path]) -> None:
    doc, _ = open_set_audit
    server, device = _rows(doc, "server", None), _rows(doc, "device", None)
    assert server.keys() == device.keys() == {0.01, 0.001}
    for t in server:
        assert device[t]["fnir"] < server[t]["fnir"], (t, device[t]["fnir"], server[t]["fnir"])
    # the door too: a claim decided on the clean projection is accepted more often at the same FAR target
    assert device[0.01]["gar_at_far"] > server[0.01]["gar_at_far"]


def test_released_fpir_with_randomized_response_stays_near_the_target(open_set_audit: tuple[dict, Path]) -> None:
    from peep.core.labels import RandomizedResponse

    doc, _ = open_set_audit
    rr = RandomizedResponse(11, 8.0)  # 10 enrolled people and unknown: the law only, nothing released
    rows = _rows(doc, "device", 8.0)
    at_1 = rows[0.01]
    assert at_1["feasible"] and at_1["fpir_floor"] == pytest.approx(rr.false_positive_floor)
    # The threshold leaves room for the strangers the label mechanism names: the model names fewer.
    assert at_1["fpir_model_target"] < 0.01
    # 268 strangers over two splits: one stranger is 0.0037; the calibration people are not the strangers.
    assert at_1["fpir"] <= 0.01 + 0.02, at_1["per_repeat"]["fpir"]
    # What was released matches the mechanism's law given what the model named (25 draws per decision).
    m = at_1["fpir_model"]
    named_stays_named = rr.keep_probability + rr.false_positive_floor - rr.other_probability
    assert at_1["fpir"] == pytest.approx(m * named_stays_named + (1 - m) * rr.false_positive_floor, abs=0.004)
    # At FPIR 0.1 % the label mechanism alone (0.33 % of strangers named at ε 8 over 11 labels) is too much.
    at_01 = rows[0.001]
    assert not at_01["feasible"] and at_01["fpir_floor"] > 0.001 and at_01["fpir"] >= 0.001


def test_people_are_disjoint_and_follow_the_rule(data_home: str) -> None:
    from peep.lab.audit import open_set
    from peep.lab.audit.config import AuditConfig

    cfg = AuditConfig(
        data_home=data_home, projection="dlib-resnet", open_set=True, progress=False, bystander=False, repeats=2
    )
    labels = _population_labels(data_home)
    counts = np.bincount(labels)
    splits = [open_set.partition_people(labels, cfg, open_set._rng(cfg, split)) for split in range(2)]
    assert set(splits[0].people["enrolled"].tolist()) != set(splits[1].people["enrolled"].tolist())
    for p in splits:
        groups = [set(p.people[g].tolist()) for g in open_set.GROUPS]
        enrolled, strangers, single_strangers, background, calibration, unused = groups
        # without the singles, no one-image stranger and nobody left out
        assert not single_strangers and not unused and not p.single_stranger_rows.size
        assert sum(len(g) for g in groups) == len(set().union(*groups)), "a person in two groups"
        # everyone is somebody: the public is every person neither enrolled nor a stranger
        assert set().union(*groups) == set(np.unique(labels).tolist())
        assert len(enrolled) == 10 and len(strangers) == 134
        assert (counts[p.people["enrolled"]] >= 26).all()
        assert ((counts[p.people["strangers"]] >= 5) & (counts[p.people["strangers"]] <= 9)).all()
        # the division of the public follows the shares, dealt per range of numbers of images
        rare_public = {q for q in background | calibration if counts[q] <= 9}
        frequent_public = (background | calibration) - rare_public
        for people, share in (
            (rare_public, cfg.open_set_background_rare),
            (frequent_public, cfg.open_set_background_frequent),
        ):
            assert abs(len(people & background) - share * len(people)) <= 1
        # one capture per stranger; every photo of each calibration person; the projection's faces public only
        assert sorted(labels[p.stranger_rows].tolist()) == sorted(p.people["strangers"].tolist())
        assert set(labels[p.calibration_rows].tolist()) == calibration
        assert (
            np.bincount(labels[p.calibration_rows], minlength=counts.size)[sorted(calibration)]
            == counts[sorted(calibration)]
        ).all()
        assert set(labels[p.background_rows].tolist()) == background
        assert np.bincount(labels[p.background_rows]).max() <= cfg.open_set_public_max_images
        basis = set(labels[p.public_rows].tolist())
        assert basis == (background if cfg.open_set_basis == "background" else background | calibration)
        assert not basis & (enrolled | strangers)
        assert set(labels[np.concatenate([p.enrol_rows, p.probe_rows])].tolist()) == enrolled
        assert not set(p.enrol_rows.tolist()) & set(p.probe_rows.tolist())
    # the draw of enrolled people, probes and strangers does not depend on how the public is divided
    other = open_set.partition_people(labels, cfg.with_(open_set_background_rare=0.25), open_set._rng(cfg, 0))
    assert np.array_equal(other.probe_rows, splits[0].probe_rows)
    assert np.array_equal(other.stranger_rows, splits[0].stranger_rows)


def test_calibration_people_weigh_alike() -> None:
    from peep.lab.audit.open_set import person_weights

    w = person_weights(np.array([7, 7, 7, 7, 3, 9, 9]))
    assert w.tolist() == pytest.approx([0.25] * 4 + [1.0] + [0.5] * 2)
    # every person's faces sum to one
    assert w.sum() == pytest.approx(3.0)


def test_deal_share_takes_its_share_alike_in_numbers_of_images() -> None:
    from peep.lab.audit.open_set import deal_share

    persons = np.arange(100) * 3
    n_images = np.repeat([5, 6, 7, 8, 9], 20)
    for share in (0.0, 0.25, 0.5, 1.0):
        taken = deal_share(persons, n_images, share, np.random.default_rng(1))
        assert abs(taken.sum() - share * 100) <= 1
        for n in (5, 6, 7, 8, 9):  # each number of images gets its share too
            assert abs(taken[n_images == n].sum() - share * 20) <= 1


def _population_labels(data_home: str) -> np.ndarray:
    from peep.server.datasets import load_dataset

    return np.asarray(load_dataset("lfw", data_home=data_home, min_faces=5).labels, dtype=np.int64)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--open-set-fpir", "0.01"], "--open-set-fpir: expected no value without --open-set"),
        (["--open-set-label-epsilons", "8"], "--open-set-label-epsilons: expected no value without --open-set"),
        (["--open-set", "--open-set-fpir", "0.7"], "--open-set-fpir: expected values in (0, 0.5), received 0.7"),
        (["--open-set", "--open-set-presets", "lda,nope"], "--open-set-presets: expected values among"),
        (["--open-set", "--open-set-label-epsilons", "0"], "--open-set-label-epsilons: expected values in (0, 40]"),
        (["--open-set", "--open-set-enrolled", "1"], "--open-set-enrolled: expected >= 2 people, received 1"),
        (
            ["--open-set", "--open-set-enrol-sweep", "5,20"],
            "--open-set-enrol-sweep: expected distinct values from 2 to 19",
        ),
        (["--open-set", "--open-set-calibration-people", "3"], "--open-set-calibration-people: expected >= 10 people"),
        (["--open-set-single-strangers", "100"], "--open-set-single-strangers: expected no value without --open-set"),
        # known only once the LFW people are counted: 41 of them have the 26 images an enrolled person needs
        (["--open-set", "--open-set-enrolled", "50", "--no-bystander"], "--open-set-enrolled: expected at most 41"),
    ],
)
def test_bad_open_set_options_exit_2_naming_the_option(
    data_home: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    assert main([*_base(data_home, tmp_path / "x"), "--mechanism", "privunit", *extra]) == 2
    assert needle in capsys.readouterr().err


def test_open_set_needs_lfw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["audit", "--dataset", str(tmp_path), "--mechanism", "privunit", "--open-set", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "--open-set: expected --dataset lfw" in capsys.readouterr().err


def test_with_the_singles_calibration_people_are_in_no_other_group(data_home: str) -> None:
    """Every name set read: the calibration people are singles, and none is enrolled, a stranger or background."""
    from peep.lab.audit import open_set
    from peep.lab.audit.config import AuditConfig
    from peep.server.datasets import singles_folder

    cfg = AuditConfig(
        data_home=data_home, projection="eigenfaces", open_set=True, progress=False, bystander=False, repeats=2,
        open_set_calibration_people=60, open_set_single_strangers=40,
    )  # fmt: skip
    pop = open_set.load_population(cfg)
    assert pop.description["calibration"] == "singles" and pop.singles.size >= 100
    # the folders' names, as the datasets name people (spaces for underscores)
    lfw_names = {p.name.replace("_", " ") for p in (Path(data_home) / "lfw_home" / "lfw_funneled").iterdir()}
    single_names = {p.name.replace("_", " ") for p in singles_folder(data_home).iterdir() if p.is_dir()}
    assert not lfw_names & single_names
    names = np.array(pop.names)
    seen: list[set[str]] = []
    for split in range(2):
        p = open_set.partition_people(pop.labels, cfg, open_set._rng(cfg, split), pop.singles)
        named = {g: set(names[p.people[g]].tolist()) for g in open_set.GROUPS}
        assert len(named["calibration"]) == 60 and len(named["single_strangers"]) == 40
        assert named["calibration"] <= single_names and named["single_strangers"] <= single_names
        others = named["enrolled"] | named["strangers"] | named["single_strangers"] | named["background"]
        assert not named["calibration"] & others
        assert (named["enrolled"] | named["strangers"] | named["background"] | named["unused"]) <= lfw_names
        # the faces say the same as the names: calibration rows are the calibration people's one photo each
        assert set(names[pop.labels[p.calibration_rows]].tolist()) == named["calibration"]
        assert set(names[pop.labels[p.single_stranger_rows]].tolist()) == named["single_strangers"]
        assert p.calibration_rows.size == 60 and p.single_stranger_rows.size == 40
        # the projection sees background faces only: no stranger of either population, no calibration face
        basis = set(names[pop.labels[p.public_rows]].tolist())
        assert basis == named["background"]
        # the public LFW people the background class does not take are left out, not calibrating
        assert named["unused"] and not named["unused"] & named["calibration"]
        seen.append(named["calibration"])
    assert seen[0] != seen[1], "the singles are dealt anew per split"


def test_singles_asked_for_and_absent_exit_2_naming_the_option(
    data_home: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "lfw_home").symlink_to(Path(data_home) / "lfw_home")
    monkeypatch.delenv("PEEP_DATASETS", raising=False)
    argv = [*_base(str(home), tmp_path / "x"), "--mechanism", "privunit", "--open-set", "--open-set-calibration",
            "singles", "--no-bystander"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--open-set-calibration: expected a lfw_singles/ folder" in err and "received 'singles'" in err
