"""``peep-edge models fetch``: a pinned SHA-256 decides what is kept, over a real HTTP server on a free port.

The file served is the team's copy of OpenCV's YuNet (``../shared/models``, found beside the staged LFW
copy); this machine reaches no other host, so the pinned address itself is not fetched here.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from peep.edge.cli import main
from peep.edge.models import MODELS

YUNET = MODELS["yunet"]


@pytest.fixture(scope="module")
def yunet_file(data_home: str) -> Path:
    from peep.server.datasets import singles_folder

    # The staged data home links the team's datasets folder (../shared/datasets); its models sit beside it.
    singles = singles_folder(data_home)
    shared = singles.resolve().parent.parent / "models" if singles is not None else Path("absent")
    path = Path(os.environ.get("PEEP_SHARED_MODELS", shared)) / YUNET.filename
    if not path.is_file():
        pytest.skip(f"the team's YuNet copy is absent here ({path}); CI has it")
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(folder served, its base URL): a real HTTP server on 127.0.0.1 and a free port."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # the test's output is the command's
        pass


def _fetch(*args: str) -> int:
    return main(["models", "fetch", "yunet", *args])


def test_a_verified_download_is_kept_and_detects_a_face(yunet_file, served, tmp_path, data_home, capsys) -> None:
    import cv2
    from peep.core.imaging import YuNetFaceDetector

    root, base = served
    shutil.copy(yunet_file, root / YUNET.filename)
    dest = tmp_path / "models"
    assert _fetch("--dest", str(dest), "--url", f"{base}/{YUNET.filename}") == 0
    kept = dest / YUNET.filename
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == YUNET.sha256
    assert sorted(p.name for p in dest.iterdir()) == [YUNET.filename]
    out = capsys.readouterr().out
    assert "downloaded, SHA-256 verified" in out and f'model_path = "{kept}"' in out
    # the file works: YuNet finds the face of an LFW photo
    photo = next(Path(data_home, "lfw_home", "lfw_funneled", "George_W_Bush").glob("*.jpg"))
    boxes = YuNetFaceDetector(model_path=str(kept)).detect(cv2.imread(str(photo)))
    assert boxes and 60 <= boxes[0].w <= 160
    # a second fetch finds it present and downloads nothing
    (root / YUNET.filename).unlink()
    assert _fetch("--dest", str(dest), "--url", f"{base}/{YUNET.filename}") == 0
    assert "present, SHA-256 verified" in capsys.readouterr().out


def test_a_file_with_the_wrong_hash_is_refused_and_nothing_is_left(yunet_file, served, tmp_path, capsys) -> None:
    root, base = served
    data = bytearray(yunet_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed: the same size, another hash
    (root / YUNET.filename).write_bytes(bytes(data))
    dest = tmp_path / "models"
    dest.mkdir()
    assert _fetch("--dest", str(dest), "--url", f"{base}/{YUNET.filename}") == 1
    err = capsys.readouterr().err
    assert "SHA-256 mismatch" in err and YUNET.sha256 in err and hashlib.sha256(data).hexdigest() in err
    assert list(dest.iterdir()) == [], "a refused file, or its partial download, was left behind"
    # and a file already there with the wrong content is not taken for the model
    (dest / YUNET.filename).write_bytes(bytes(data))
    assert _fetch("--dest", str(dest), "--from", str(root / YUNET.filename)) == 1
    assert hashlib.sha256((dest / YUNET.filename).read_bytes()).hexdigest() != YUNET.sha256


def test_an_oversized_download_is_cut_off(served, tmp_path, capsys) -> None:
    root, base = served
    (root / YUNET.filename).write_bytes(np.random.default_rng(0).bytes(YUNET.max_bytes + 1))
    dest = tmp_path / "models"
    assert _fetch("--dest", str(dest), "--url", f"{base}/{YUNET.filename}") == 1
    assert f"larger than {YUNET.max_bytes} bytes" in capsys.readouterr().err
    assert not dest.exists() or list(dest.iterdir()) == []


def test_offline_it_says_what_to_download_and_where_to_put_it(tmp_path, capsys) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dest = tmp_path / "models"
    assert _fetch("--dest", str(dest), "--url", f"http://127.0.0.1:{port}/{YUNET.filename}", "--timeout", "5") == 1
    err = capsys.readouterr().err
    assert f"could not download http://127.0.0.1:{port}/" in err
    assert YUNET.url in err and YUNET.sha256 in err and str(dest / YUNET.filename) in err and "--from FILE" in err
    assert not dest.exists() or list(dest.iterdir()) == []


def test_a_copy_brought_by_hand_is_verified(yunet_file, tmp_path, capsys) -> None:
    dest = tmp_path / "models"
    assert _fetch("--dest", str(dest), "--from", str(yunet_file)) == 0
    assert "copied, SHA-256 verified" in capsys.readouterr().out
    assert (dest / YUNET.filename).read_bytes() == yunet_file.read_bytes()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["models", "fetch", "nope"], "model: expected one of yunet, received 'nope'"),
        (["models", "fetch", "yunet", "--url", "file:///etc/passwd"], "--url: expected an http or https address"),
        (["models", "fetch", "yunet", "--from", "/nonexistent/yunet.onnx"], "--from: expected a file"),
    ],
)
def test_bad_requests_name_what_is_wrong(argv, needle, tmp_path, capsys) -> None:
    assert main([*argv, "--dest", str(tmp_path / "m")]) == 1
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_models_list_names_the_pinned_file(capsys) -> None:
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert YUNET.sha256 in out and YUNET.url in out and "MIT" in out


def test_auto_takes_yunet_where_fetch_put_it_and_else_haar_with_a_warning(
    yunet_file, tmp_path, monkeypatch, caplog
) -> None:
    import logging

    from peep.core.imaging import HaarFaceDetector, YuNetFaceDetector
    from peep.edge.config import DetectorConfig
    from peep.edge.detection import build_detector

    monkeypatch.setenv("PEEP_MODELS_DIR", str(tmp_path / "models"))
    with caplog.at_level(logging.INFO, logger="peep.edge.detection"):
        assert isinstance(build_detector(DetectorConfig()), HaarFaceDetector)
    warned = [r for r in caplog.records if r.getMessage() == "detector_chosen" and r.levelno == logging.WARNING]
    assert warned, "no warning when auto falls back to Haar"
    assert _fetch("--from", str(yunet_file)) == 0  # into $PEEP_MODELS_DIR
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="peep.edge.detection"):
        assert isinstance(build_detector(DetectorConfig()), YuNetFaceDetector)
    assert any(r.getMessage() == "detector_chosen" and r.levelno == logging.INFO for r in caplog.records)
    # a named kind is taken as named, whatever is fetched
    assert isinstance(build_detector(DetectorConfig(kind="haar")), HaarFaceDetector)


def test_only_the_pinned_file_counts_as_the_model(yunet_file, tmp_path, monkeypatch) -> None:
    from peep.edge.models import find_model, is_pinned

    assert is_pinned(Path(yunet_file), "yunet")
    altered = tmp_path / "altered" / MODELS["yunet"].filename
    altered.parent.mkdir()
    altered.write_bytes(Path(yunet_file).read_bytes() + b"\0")
    assert not is_pinned(altered, "yunet") and not is_pinned(tmp_path / "absent.onnx", "yunet")
    monkeypatch.setenv("PEEP_MODELS_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("PEEP_YUNET_MODEL", raising=False)
    # an altered copy is passed over for the pinned one further down the list
    good = tmp_path / "good"
    good.mkdir()
    shutil.copy(yunet_file, good / MODELS["yunet"].filename)
    assert find_model("yunet", [altered.parent, good]) == good / MODELS["yunet"].filename
    assert find_model("yunet", [altered.parent]) is None
    monkeypatch.setenv("PEEP_YUNET_MODEL", str(yunet_file))
    assert find_model("yunet") == Path(yunet_file)
