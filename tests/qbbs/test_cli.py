"""``peep qbbs ...``: a small end-to-end evaluation on LFW and the admin commands."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from peep.server.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_evaluate_writes_the_json_and_plots(data_home, tmp_path, capsys):
    out = tmp_path / "eval"
    rc = main(
        [
            "qbbs",
            "evaluate",
            "--dataset",
            "lfw",
            "--data-home",
            data_home,
            "--min-faces",
            "100",
            "--max-per-subject",
            "24",
            "--epsilon",
            "2",
            "--epsilons",
            "1,1000",
            "--components",
            "64",
            "--out",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "GAR at FAR = 1 %" in printed and "synthetic traits: height, weight" in printed
    result = json.loads((out / "qbbs.json").read_text())

    gar = result["gar_at_far_1pct"]
    for key in ("face", "face_all", "face_all_noised"):
        assert 0.0 <= gar[key] <= 1.0
    assert set(gar["per_trait"]) == {"age", "gender", "height", "weight"}
    for row in gar["per_trait"].values():
        assert set(row) == {"face", "face_trait", "face_trait_noised"}
        assert all(0.0 <= v <= 1.0 for v in row.values())
    # The chapter's shared-noise transform cancels the noise exactly.
    assert gar["face_all_noised_shared_noise"] == gar["face_all"]

    assert result["synthetic"] == ["height", "weight"]
    assert result["soft_traits"]["height"]["synthetic"] and not result["soft_traits"]["age"]["synthetic"]
    assert "NHANES" in result["soft_traits"]["weight"]["source"]
    mech = result["face"]["mechanism"]
    assert (mech["kind"], mech["epsilon"]) == ("peep-raw", 8.0)
    assert mech["epsilon_vector"] > mech["epsilon_coordinate"] > 0
    assert result["dataset"]["n_subjects"] == 5 and result["dataset"]["n_images"] == 120

    qs = result["query_structure"]
    assert qs["m"] == 2 and qs["epsilon_per_response"] == 2.0
    assert qs["sensitivity"] == {"age": 72.0, "gender": 1.0, "height": 70.0, "weight": 120.0}
    # net noise of Q1 - Q2 at ε = 2: sd = 2·Δf/ε
    assert qs["net_noise_std"]["height"] == pytest.approx(2 * 70.0 / 2.0, rel=1e-6)

    far = result["roc"]["far"]
    assert far == sorted(far) and far[0] <= 1e-3 and far[-1] == 1.0
    for curve in result["roc"]["curves"].values():
        assert len(curve) == len(far)
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(curve))  # GAR grows with FAR

    assert result["face"]["recogniser"]["preset"] == "default"  # the server's default preset
    dev, dis, ver = result["deviation"], result["distortion"], result["verification_vs_epsilon"]
    assert dev["epsilons"] == dis["epsilons"] == ver["epsilons"] == [1.0, 2.0, 1000.0]
    for d in dev["traits"].values():
        assert d["mean_abs"][0] > d["mean_abs"][1] > d["mean_abs"][2] > 0  # less noise as ε grows
    # Dist over the m·n = 2·4 responses: mean difference ≈ 0 (zero-mean noise); as an MSE it follows
    # Var(Laplace) = 2(Δf/ε)² of each trait's responses
    assert (dis["m"], dis["n_traits"]) == (2, 4)
    for n, d in dis["traits"].items():
        for got, want in zip(d["mean_squared_difference"], d["expected_mean_squared_difference"], strict=True):
            assert got == pytest.approx(want, rel=0.5), n
        assert d["expected_mean_squared_difference"][0] == pytest.approx(2 * (qs["sensitivity"][n] / 1.0) ** 2)
    mse = dis["mean_squared_difference"]
    assert mse[0] > mse[1] > mse[2] > 0
    assert mse[1] == pytest.approx(np.mean([d["mean_squared_difference"][1] for d in dis["traits"].values()]))
    assert abs(dis["mean_difference"][1]) < 3 * math.sqrt(mse[1] / (8 * 150))  # 150 test claims of 8 responses
    assert ver["decision_flip_rate"][-1] <= ver["decision_flip_rate"][0]
    assert ver["score_change"][-1] < ver["score_change"][0]
    assert result["module_consistency"]["max_abs_difference"] < 1e-9
    assert result["module_consistency"]["claims_checked"] > 0

    assert sorted(result["plots"]) == ["deviation.png", "distortion.png", "parzen.png", "roc.png", "verification.png"]
    for name in result["plots"]:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000


def test_evaluate_usage_errors(tmp_path, capsys):
    assert main(["qbbs", "evaluate", "--dataset", "lfw", "--epsilon", "0", "--out", str(tmp_path)]) == 2
    assert "--epsilon" in capsys.readouterr().err
    assert (
        main(["qbbs", "evaluate", "--dataset", str(tmp_path / "missing"), "--epsilon", "1", "--out", str(tmp_path)])
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
    assert (
        main(["qbbs", "evaluate", "--dataset", "lfw", "--epsilon", "1", "--mechanism", "nope", "--out", str(tmp_path)])
        == 2
    )


def _config(tmp_path: Path, cap: float = 3.0) -> str:
    p = tmp_path / "qbbs.toml"
    p.write_text(
        f"[qbbs]\nepsilon = 1.0\nepsilon_cap = {cap}\nstore_path = 'state/traits.sqlite'\n"
        "ledger_path = 'state/spend.jsonl'\n"
    )
    return str(p)


def test_admin_commands(tmp_path, capsys):
    cfg = _config(tmp_path)
    assert (
        main(["qbbs", "enrol", "--config", cfg, "--subject", "bob", "--trait", "age=52", "--trait", "height=181.5"])
        == 0
    )
    assert "enrolled 2" in capsys.readouterr().out
    assert (tmp_path / "state" / "traits.sqlite").stat().st_mode & 0o077 == 0  # owner-only
    for _ in range(3):
        assert main(["qbbs", "query", "--config", cfg, "--subject", "bob", "--trait", "age"]) == 0
    out = capsys.readouterr().out
    assert "total 3 of 3" in out and "Y' =" in out
    assert main(["qbbs", "query", "--config", cfg, "--subject", "bob", "--trait", "age"]) == 1
    assert "refused" in capsys.readouterr().err
    assert main(["qbbs", "odometer", "--config", cfg, "--log"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("bob: ε 3 of 3 (3 releases")
    entries = [json.loads(x) for x in lines[1:]]
    assert [e["op"] for e in entries] == ["query"] * 3 and entries[0]["requester"] == "cli"
    assert main(["qbbs", "erase", "--config", cfg, "--subject", "bob"]) == 0
    assert "erased 2" in capsys.readouterr().out
    # Again, or a mistyped id: nothing to erase is an error, not a silent success.
    assert main(["qbbs", "erase", "--config", cfg, "--subject", "bob"]) == 1
    assert "no soft traits of 'bob' are stored; nothing erased" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["enrol", "--subject", "bob", "--trait", "shoe=40"], "shoe"),
        (["enrol", "--subject", "bob", "--trait", f"age={math.nan}"], "finite"),
        (["enrol", "--subject", "bob", "--trait", "age=10"], "declared range"),
        (["query", "--subject", "nobody", "--trait", "age"], "nobody"),
    ],
)
def test_admin_command_errors_exit_2(tmp_path, capsys, argv, text):
    cfg = _config(tmp_path)
    assert main(["qbbs", argv[0], "--config", cfg, *argv[1:]]) == 2
    assert text in capsys.readouterr().err


def test_admin_commands_need_a_persistent_store(tmp_path, capsys):
    p = tmp_path / "mem.toml"
    p.write_text("[qbbs]\nepsilon = 1.0\n")
    assert main(["qbbs", "odometer", "--config", str(p)]) == 2
    assert "store_path" in capsys.readouterr().err
