"""`peep bundle build --projection fisherfaces`: a signed bundle whose projector computes Fisherfaces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from peep.core.bundle import ProjectionBundle, load_public_key
from peep.core.projections import FisherfaceProjection
from peep.server.cli import main


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    assert main(["keys", "generate", "--out", str(d / "k")]) == 0
    return d / "k.key", d / "k.pub"


@pytest.fixture(scope="module")
def three_people(tmp_path_factory, data_home):
    src = Path(data_home) / "lfw_home" / "lfw_funneled"
    ds = tmp_path_factory.mktemp("faces")
    for person in ("Ai_Sugiyama", "Ahmed_Chalabi", "Alastair_Campbell"):
        shutil.copytree(src / person, ds / person)
    return ds


def _build(dataset, keys, out, *extra):
    return main(
        [
            "bundle",
            "build",
            "--dataset",
            str(dataset),
            *extra,
            "--projection",
            "fisherfaces",
            "--signing-key",
            str(keys[0]),
            "--out",
            str(out),
        ]
    )


@pytest.mark.slow
def test_fisherface_bundle_from_the_lfw_background(tmp_path, data_home, keys, lfw100, capsys):
    out = tmp_path / "fisher"
    rc = _build(
        "lfw", keys, out, "--data-home", data_home, "--min-faces", "5", "--max-faces", "9", "--components", "32"
    )
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    md = json.loads((out / "metadata.json").read_text())
    assert md["projection"] == "fisherfaces" and md["n_components"] == 32
    facts = md["fisherfaces"]
    assert facts["n_classes"] == md["provenance"]["n_subjects"] > 200
    # Fitted on the public faces and their mirror images (the fisherfaces default).
    assert facts["mirrored"] and facts["n_faces"] == 2 * md["provenance"]["n_images"] and facts["n_pca"] == 200
    assert "explained_variance_ratio" not in md
    # The summary describes the LDA, not an eigenface variance it does not have.
    assert "(fisherfaces)" in printed.out and f"LDA on {facts['n_classes']} identities" in printed.out
    assert "privunit" in printed.out and "of variance kept" not in printed.out
    assert main(["bundle", "verify", str(out), "--public-key", str(keys[1])]) == 0
    bundle = ProjectionBundle.load(out, load_public_key(keys[1]))
    bundle.check_mechanism("privunit-g")
    unit = bundle.project(lfw100.images[:10], "unit")
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    assert isinstance(bundle.projection(), FisherfaceProjection)


def test_too_many_components_for_the_identities_is_a_usage_error(tmp_path, three_people, keys, capsys):
    rc = _build(three_people, keys, tmp_path / "b", "--min-faces", "2", "--components", "8")
    err = capsys.readouterr().err
    assert rc == 2
    assert "--components" in err and "n_classes - 1 = 2" in err and "received 8" in err
    assert not (tmp_path / "b").exists()


def test_a_small_folder_dataset_builds_with_k_up_to_identities_minus_one(tmp_path, three_people, keys, capsys):
    out = tmp_path / "b"
    rc = _build(three_people, keys, out, "--min-faces", "2", "--components", "2", "--size", "40x50")
    assert rc == 0, capsys.readouterr().err
    md = json.loads((out / "metadata.json").read_text())
    facts = md["fisherfaces"]
    assert md["n_components"] == 2 and facts["n_classes"] == 3
    assert facts["n_pca"] == 2 * md["provenance"]["n_images"] - 3  # capped at n - n_classes (n doubled by mirroring)
