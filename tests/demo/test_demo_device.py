"""The default demo: cameras and the door decide on the device, with thresholds set on LFW's one-image people.

A reduced run (three subjects, four strangers, two cameras, 150 calibration people) through the real server,
agents and door; what it must show: where each decision was made, who set the thresholds, that no person has
two roles (every name set the run wrote), that a camera's appearance cost only its label's ε and that no
template of an appearance reached the server.
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import pytest
from peep.server.cli import main

pytestmark = [pytest.mark.demo, pytest.mark.processes]

SMALL = ["--subjects", "3", "--enrol-images", "8", "--probe-images", "2", "--strangers", "4", "--cameras", "2",
         "--qbbs-epsilon", "20", "--public-max-faces", "5", "--calibration-people", "150"]  # fmt: skip


@pytest.fixture(scope="module")
def device_run(tmp_path_factory: pytest.TempPathFactory, data_home: str) -> tuple[Path, dict]:
    from peep.server.datasets import singles_folder

    if singles_folder(data_home) is None:
        pytest.fail(f"no lfw_singles/ in the data home {data_home}: scripts/stage-lfw.sh links it beside lfw_home/")
    out = tmp_path_factory.mktemp("demo-device") / "run"
    assert main(["demo", "--data-home", data_home, "--out", str(out), *SMALL]) == 0
    return out, json.loads((out / "summary.json").read_text())


def test_the_default_demo_decides_on_the_devices_with_thresholds_set_on_the_singles(device_run):
    _, s = device_run
    ident, door = s["identification"], s["door"]
    assert ident["decided_on"] == "device" and door["decided_on"] == "device"
    # 150 chosen; those whose one photo shows a face the detector finds set the thresholds.
    assert s["data"]["calibration_population"] == "lfw_singles" and 140 <= s["data"]["calibration_people"] <= 150
    assert s["data"]["calibration_views"] == "photos"  # portrait videos: the photos as they are
    # A camera's appearance costs its label's ε alone (k-RR at the default ε_label 8): no template was released.
    per = ident["epsilon_per_appearance"]
    assert per["appearances"] > 0 and per["max"] <= 8.0 + 1e-9
    assert s["kept_templates"]["recognised"] == 0 and s["kept_templates"]["strangers"] == 0
    assert 0.0 <= ident["accuracy"] <= 1.0 and ident["stranger_templates"] >= 2


def test_no_person_has_two_roles_in_the_default_demo(device_run, data_home):
    """Enrolled, strangers, background class, the bundle's public faces and the calibration people: pairwise
    disjoint but for the background class, whose faces the bundle is fitted on too (both are public people
    the model knows as "not enrolled"); read from the names the run wrote. The calibration people are
    one-image people of the singles."""
    from peep.server.datasets import singles_folder

    out, s = device_run
    roles = json.loads((out / "people.json").read_text())
    assert roles["calibration_population"] == "lfw_singles"
    assert len(roles["calibration"]) == s["data"]["calibration_people"]
    sets = {k: {n.replace(" ", "_") for n in roles[k]} for k in ("enrolled", "strangers", "background", "bundle",
                                                                   "calibration")}  # fmt: skip
    assert all(sets.values()), {k: len(v) for k, v in sets.items()}
    for (a, sa), (b, sb) in combinations(sets.items(), 2):
        if {a, b} != {"background", "bundle"}:
            assert not sa & sb, f"{a} and {b} share {sorted(sa & sb)[:5]}"
    singles = singles_folder(data_home)
    assert singles is not None
    for name in roles["calibration"]:
        photos = [p for p in (singles / name).iterdir() if p.is_file()]
        assert len(photos) == 1, name
