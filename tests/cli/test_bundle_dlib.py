"""``--projection dlib-resnet`` through the CLI: bundle build and audit on a small folder of real LFW faces.

The real network runs (extra ``peep-server[dlib]``, installed by
scripts/bootstrap.sh); three people keep it to ~40 descriptors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from peep.core.bundle import ProjectionBundle, load_public_key
from peep.core.projections.descriptor import DLIB_RESNET_MODEL_SHA256
from peep.lab.audit.schema import validate_audit
from peep.server.cli import main

PEOPLE = ("Colin_Powell", "Tony_Blair", "Gerhard_Schroeder")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    assert main(["keys", "generate", "--out", str(d / "k")]) == 0
    return d / "k.key", d / "k.pub"


@pytest.fixture(scope="module")
def folder(tmp_path_factory, data_home) -> Path:
    src = Path(data_home) / "lfw_home" / "lfw_funneled"
    ds = tmp_path_factory.mktemp("faces")
    for person in PEOPLE:
        (ds / person).mkdir()
        for f in sorted((src / person).glob("*.jpg"))[:14]:
            shutil.copy(f, ds / person / f.name)
    return ds


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    # One cache for the module (descriptors are computed once), outside the shared one.
    monkeypatch.setenv("PEEP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "dlib-cache"))


def _build(folder, keys, out, *extra):
    argv = ["bundle", "build", "--dataset", str(folder), "--min-faces", "10", "--projection", "dlib-resnet"]
    return main([*argv, *extra, "--signing-key", str(keys[0]), "--out", str(out)])


@pytest.mark.slow
def test_a_dlib_bundle_from_a_folder_dataset(tmp_path, folder, keys, capsys):
    out = tmp_path / "dlib"
    rc = _build(folder, keys, out, "--components", "8")
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    md = json.loads((out / "metadata.json").read_text())
    assert md["projection"] == "dlib-resnet" and md["n_components"] == 8 and md["n_features"] == 128
    network = md["input"]["network"]
    assert md["input"]["kind"] == "dlib-resnet" and md["input"]["dimension"] == 128
    assert {k: network[k] for k in DLIB_RESNET_MODEL_SHA256} == DLIB_RESNET_MODEL_SHA256
    assert network["package"].startswith("face_recognition_models ")
    assert "dlib ResNet descriptors" in printed.out and "55533b28a958" in printed.out
    assert main(["bundle", "verify", str(out), "--public-key", str(keys[1])]) == 0
    bundle = ProjectionBundle.load(out, load_public_key(keys[1]))
    unit = bundle.project(np.random.default_rng(0).normal(size=(5, 128)), "unit")
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--components", "200"], "--components: expected at most"),
        (["--components", "4", "--mirror"], "--mirror: expected --no-mirror or nothing with --projection dlib-resnet"),
    ],
)
def test_usage_errors_name_the_option(tmp_path, folder, keys, capsys, extra, needle):
    assert _build(folder, keys, tmp_path / "b", *extra) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_an_audit_of_the_descriptor_projection(tmp_path, folder, capsys):
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
        "--projection",
        "dlib-resnet",
        "--basis",
        "train",
        "--mechanism",
        "privunit",
        "--epsilons",
        "8,64",
        "--components",
        "4",
        "--repeats",
        "1",
        "--sweep-components",
        "none",
        "--sweep-images",
        "none",
        "--jobs",
        "1",
        "--no-bystander",  # its strangers would be LFW's other people: thousands of descriptors for this small test
    ]
    assert main(argv) == 0, capsys.readouterr().err
    doc = json.loads((out / "audit.json").read_text())
    validate_audit(doc)
    assert doc["config"]["projection"] == "dlib-resnet"
    # Three people that a face network tells apart easily: without noise the audit is near perfect.
    assert doc["no_privacy"]["accuracy"] >= 0.9
    by_eps = {r["epsilon"]: r for r in doc["results"]}
    assert set(by_eps) == {8.0, 64.0}
    assert by_eps[64.0]["accuracy"] >= by_eps[8.0]["accuracy"] - 0.15
    # Reconstruction is a retrieval of public faces for descriptors: the plot and the report say so.
    assert "reconstruction_grid" in doc["plots"]
    assert "retrieves the public face whose template is nearest" in (out / "report.html").read_text()
    # --basis train puts the audited people's own training faces in the retrieval pool: it finds them.
    assert by_eps[64.0]["reconstruction_reid"] >= 0.9
