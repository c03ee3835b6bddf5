"""Public photos drawn as a scene's camera sees a face (peep.lab.scenes.views): what a run on scenes
sets its devices' thresholds on."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from peep.core.imaging import primary_face
from peep.edge.config import DetectorConfig
from peep.edge.detection import build_detector
from peep.edge.testing import lfw_people
from peep.lab.demo.scenario import link_folder
from peep.lab.scenes.views import camera_view, redraw_as_seen, write_camera_views


@pytest.fixture(scope="module")
def photos(data_home: str) -> list[Path]:
    return lfw_people(data_home)["Colin_Powell"][:10]


def _sharpness(img: np.ndarray) -> float:
    return float(cv2.Laplacian(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY), cv2.CV_64F).var())


def test_a_view_keeps_the_photo_s_frame_loses_detail_and_is_seeded(photos: list[Path]) -> None:
    detector = build_detector(DetectorConfig(kind="haar"))
    found = 0
    for i, path in enumerate(photos):
        img = cv2.imread(str(path), cv2.IMREAD_COLOR)
        view = camera_view(img, np.random.default_rng(i))
        assert view.shape == img.shape and view.dtype == np.uint8
        assert np.array_equal(view, camera_view(img, np.random.default_rng(i)))
        assert not np.array_equal(view, camera_view(img, np.random.default_rng(i + 100)))
        # small, blurred and compressed, then scaled back: less fine detail than the photo, always
        assert _sharpness(view) < _sharpness(img)
        found += primary_face(detector.detect(view), view.shape) is not None
    # still a face where the photo's was, for the desk's detector, in most views
    assert found >= 7, f"the desk's detector found a face in {found} of {len(photos)} views"


def test_a_bad_photo_and_a_missing_person_are_named(lfw_folder, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"photo: expected a BGR image of shape \(H, W, 3\)"):
        camera_view(np.zeros((250, 250), np.uint8), np.random.default_rng(0))
    source = lfw_folder({"Colin_Powell": 3})
    out = write_camera_views(source, ["Colin_Powell"], tmp_path / "views", seed=1)
    written = sorted((out / "Colin_Powell").glob("*.png"))
    assert [f.stem for f in written] == sorted(f.stem for f in (source / "Colin_Powell").glob("*.jpg"))
    assert all(cv2.imread(str(f)).shape == (250, 250, 3) for f in written)
    with pytest.raises(FileNotFoundError, match="no photo of 'Nobody_Here'"):
        write_camera_views(source, ["Nobody_Here"], tmp_path / "views2", seed=1)


def test_an_enrolment_folder_has_its_share_of_photos_redrawn_and_no_more(photos: list[Path], tmp_path: Path) -> None:
    folder = link_folder(photos, tmp_path / "enrol")
    assert redraw_as_seen(folder, 0.0, np.random.default_rng(0)) == []
    drawn = redraw_as_seen(folder, 0.5, np.random.default_rng(0))
    assert len(drawn) == 5 and all(f.suffix == ".png" and not f.is_symlink() for f in drawn)
    links = sorted(f for f in folder.iterdir() if f.is_symlink())
    assert len(links) == 5 and len(list(folder.iterdir())) == len(photos), "each photo once, drawn or as it is"
    for f in drawn:
        original = cv2.imread(str(folder / f.name.replace("-seen.png", photos[0].suffix)))
        assert original is None, "the drawn photo's link is gone"
        assert cv2.imread(str(f)).shape == (250, 250, 3)
    sources = {p.resolve() for p in photos}
    assert {f.resolve() for f in links} < sources, "the photos not drawn are still the photos"
    # a draw the desk would find no face in is drawn again, then the photo is left as it is
    refused = link_folder(photos[:4], tmp_path / "refused")
    tries: list[int] = []
    assert redraw_as_seen(refused, 1.0, np.random.default_rng(0), lambda v: tries.append(1) and False) == []
    assert len(tries) == 4 * 5 and all(f.is_symlink() for f in refused.iterdir())
    with pytest.raises(ValueError, match=r"share: expected 0 <= share <= 1, received 1.5"):
        redraw_as_seen(folder, 1.5, np.random.default_rng(0))
