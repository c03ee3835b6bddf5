from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from peep.server.datasets import DatasetError, load_dataset, load_lfw_sklearn


def test_lfw100_is_the_papers_five_people(lfw100):
    assert lfw100.n_subjects == 5
    assert set(lfw100.target_names) == {
        "Colin Powell",
        "Donald Rumsfeld",
        "George W Bush",
        "Gerhard Schroeder",
        "Tony Blair",
    }
    # Detection misses a handful of the 1,140 images; the rest are normalised faces.
    assert 1100 <= lfw100.n_images <= 1140
    assert lfw100.images.shape[1:] == (62, 47)
    assert lfw100.images.min() >= 0 and lfw100.images.max() <= 1
    assert lfw100.normalisation["method"] == "detector"


def test_background_is_disjoint_from_enrolled(lfw100, lfw_background):
    assert not set(lfw100.target_names) & set(lfw_background.target_names)
    counts = np.bincount(lfw_background.labels)
    assert counts.min() >= 5 and counts.max() <= 9


def test_fixed_crop_matches_scikit_learn(data_home):
    ours = load_dataset("lfw", data_home=data_home, min_faces=100, normalisation="lfw-crop")
    theirs = load_lfw_sklearn(data_home=data_home, min_faces=100)
    assert ours.n_images == theirs.n_images == 1140
    assert ours.target_names == theirs.target_names
    # scikit-learn shuffles images; match each of ours to its nearest crop of the same person.
    # Same region, slightly different interpolation -> small differences; other images are far.
    A = ours.X[ours.labels == 0][:40]
    B = theirs.X[theirs.labels == 0]
    dist = np.abs(A[:, None, :] - B[None, :, :]).mean(axis=2)
    nearest = np.sort(dist, axis=1)
    assert np.median(nearest[:, 0]) < 0.03
    assert np.median(nearest[:, 1]) > 2 * np.median(nearest[:, 0])


def _folder(tmp_path: Path, data_home: str, people: dict[str, int]) -> Path:
    src = Path(data_home) / "lfw_home" / "lfw_funneled"
    root = tmp_path / "ds"
    for person, n in people.items():
        (root / person).mkdir(parents=True)
        for f in sorted((src / person).glob("*.jpg"))[:n]:
            shutil.copy(f, root / person / f.name)
    return root


def test_folder_dataset_formats_and_min_faces(tmp_path, data_home):
    root = _folder(tmp_path, data_home, {"Tony_Blair": 6, "Colin_Powell": 2})
    # png and pgm are read too.
    img = cv2.imread(str(next((root / "Tony_Blair").glob("*.jpg"))), cv2.IMREAD_GRAYSCALE)
    cv2.imwrite(str(root / "Tony_Blair" / "extra.png"), img)
    cv2.imwrite(str(root / "Tony_Blair" / "extra2.pgm"), img)
    ds = load_dataset(str(root), min_faces=5)
    assert ds.target_names == ["Tony Blair"]
    assert ds.n_images >= 6
    assert any(p.endswith(".pgm") for p in ds.paths)


def test_folder_dataset_errors(tmp_path, data_home):
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(str(tmp_path / "missing"))
    (tmp_path / "empty" / "nobody").mkdir(parents=True)
    with pytest.raises(DatasetError, match="no identity folder with at least"):
        load_dataset(str(tmp_path / "empty"), min_faces=1)
    bad = tmp_path / "bad" / "someone"
    bad.mkdir(parents=True)
    (bad / "broken.jpg").write_bytes(b"not an image")
    with pytest.raises(DatasetError, match="no identity has 1 images with a detected face"):
        load_dataset(str(tmp_path / "bad"), min_faces=1)
    with pytest.raises(DatasetError, match="lfw-crop"):
        load_dataset(str(tmp_path / "bad"), normalisation="lfw-crop")
    with pytest.raises(DatasetError, match="--max-faces"):
        load_dataset("lfw", data_home=data_home, min_faces=10, max_faces=5)


@pytest.fixture
def images_read(monkeypatch) -> list[str]:
    """The paths the face pipeline reads and searches from now on (a list that grows)."""
    from peep.server import facework

    calls: list[str] = []
    real = facework.process_images

    def counting(items, *args, **kw):
        calls.extend(item[0] for item in items)
        return real(items, *args, **kw)

    monkeypatch.setattr(facework, "process_images", counting)
    return calls


def test_normalised_faces_are_cached_per_image_and_shared_by_every_selection(
    lfw_folder, tmp_path, monkeypatch, images_read
):
    """A selection of people reuses the detections of any earlier selection that had them."""
    from peep.server import datasets

    monkeypatch.setenv("PEEP_CACHE_DIR", str(tmp_path / "cache"))
    folder = lfw_folder({"Ahmed_Chalabi": 5, "Ai_Sugiyama": 5, "Al_Gore": 8})
    calls = images_read
    everyone = datasets.load_dataset(str(folder), min_faces=1, jobs=1)
    assert len(calls) == 18 and len(set(calls)) == 18  # each image read and searched once
    calls.clear()
    few = datasets.load_dataset(str(folder), min_faces=1, max_faces=5)
    assert calls == [] and few.n_subjects == 2  # served from the cache
    np.testing.assert_array_equal(few.images, everyone.images[np.isin(everyone.labels, [0, 1])])


def test_people_not_asked_for_are_never_read(lfw_folder, tmp_path, monkeypatch, images_read):
    """``people=`` selects identities before any image is read (the demo never describes strangers' photos)."""
    from peep.server import datasets

    monkeypatch.setenv("PEEP_CACHE_DIR", str(tmp_path / "cache"))
    folder = lfw_folder({"Ahmed_Chalabi": 5, "Ai_Sugiyama": 5, "Al_Gore": 5})
    calls = images_read
    two = datasets.load_dataset(str(folder), min_faces=1, jobs=1, people=["Al Gore", "Ahmed_Chalabi"])
    assert two.target_names == ["Ahmed Chalabi", "Al Gore"]
    assert len(calls) == 10 and not any("Ai_Sugiyama" in c for c in calls)
    with pytest.raises(DatasetError, match="among the 1 people asked for"):
        datasets.load_dataset(str(folder), min_faces=1, jobs=1, people=["Nobody_Here"])
