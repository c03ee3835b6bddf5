"""Faces and descriptors computed once per image, on every core, cached by the image file's content.

A fake encoder (the mean colour of the face box) keeps most of these tests to
a few LFW images and milliseconds; the real network (dlib) runs in the
parallel-equals-serial test, on eight images.
"""

from __future__ import annotations

import io
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from peep.core.imaging import DEFAULT_GEOMETRY, FaceBox, HaarFaceDetector
from peep.server import facecache, facework
from peep.server.datasets import FaceDataset, load_dataset
from peep.server.facecache import CACHE_FILE, FaceCache
from peep.server.progress import Progress

PEOPLE = {"Ahmed_Chalabi": 4, "Al_Gore": 4}


class FakeEncoder:
    """The mean colour of the face box and its width, shape (4,); counts its calls."""

    kind = "fake"
    dimension = 4

    def __init__(self, model: str = "a") -> None:
        self.calls = 0
        self.model = model

    @property
    def identity(self) -> dict[str, str]:
        return {"kind": self.kind, "model": self.model}

    def encode(self, image: NDArray[np.uint8], box: FaceBox) -> NDArray[np.float32]:
        self.calls += 1
        x, y, w, h = (round(v) for v in (box.x, box.y, box.w, box.h))
        crop = image[max(0, y) : y + h, max(0, x) : x + w].reshape(-1, 3)
        return np.array([*crop.mean(axis=0), box.w], dtype=np.float32)


def _copy_people(data_home: str, dst: Path, people: dict[str, int] = PEOPLE) -> Path:
    """Byte copies (new inodes, new mtimes) of the first images of ``people``."""
    src = Path(data_home) / "lfw_home" / "lfw_funneled"
    for person, n in people.items():
        (dst / person).mkdir(parents=True)
        for f in sorted((src / person).glob("*.jpg"))[:n]:
            shutil.copy(f, dst / person / f.name)
    return dst


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("PEEP_CACHE_DIR", str(d))
    return d


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths of the images computed (read and searched for a face) in this process."""
    calls: list[str] = []
    real = facework.process_images

    def spy(items: Any, *args: Any, **kw: Any) -> list[facework.ImageResult]:
        calls.extend(item[0] for item in items)
        return real(items, *args, **kw)

    monkeypatch.setattr(facework, "process_images", spy)
    return calls


@pytest.fixture
def detections(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per face search by the default (Haar) detector in this process."""
    calls: list[int] = []
    real = HaarFaceDetector.detect

    def spy(self: HaarFaceDetector, image: NDArray[Any]) -> list[FaceBox]:
        calls.append(1)
        return real(self, image)

    monkeypatch.setattr(HaarFaceDetector, "detect", spy)
    return calls


def _same(a: FaceDataset, b: FaceDataset) -> None:
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.descriptors, b.descriptors)
    assert a.target_names == b.target_names and a.n_skipped == b.n_skipped


def test_the_same_images_in_another_folder_hit_the_cache(
    tmp_path: Path, data_home: str, cache_dir: Path, computed: list[str], detections: list[int]
) -> None:
    a = _copy_people(data_home, tmp_path / "a")
    first = load_dataset(str(a), min_faces=1, encoder=(enc := FakeEncoder()))
    # One read and one face search per image, whether it yields a face and a descriptor or not.
    assert len(computed) == 8 and len(detections) == 8 and enc.calls == first.n_images >= 6
    computed.clear()
    detections.clear()

    b = tmp_path / "b"
    shutil.copytree(a, b)  # other paths, other inodes, other mtimes: the same bytes
    again = load_dataset(str(b), min_faces=1, encoder=(enc := FakeEncoder()))
    assert computed == [] and detections == [] and enc.calls == 0
    _same(first, again)
    assert again.paths[0].startswith(str(b))

    moved = tmp_path / "moved"
    os.rename(a, moved)
    os.utime(next(moved.rglob("*.jpg")), (0, 0))  # touched: re-hashed, same content, still a hit
    _same(first, load_dataset(str(moved), min_faces=1, encoder=FakeEncoder()))
    assert computed == [] and detections == []


def test_unchanged_files_are_not_read_again_to_hash_them(
    tmp_path: Path, data_home: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy_people(data_home, tmp_path / "faces")
    load_dataset(str(folder), min_faces=1)
    reads: list[str] = []
    real = facecache.file_sha256

    def spy(path: str | os.PathLike[str]) -> str | None:
        reads.append(str(path))
        return real(path)

    monkeypatch.setattr(facecache, "file_sha256", spy)
    load_dataset(str(folder), min_faces=1)
    assert reads == []
    changed = next(folder.rglob("*.jpg"))
    changed.write_bytes(changed.read_bytes())  # rewritten: new mtime, so hashed again
    load_dataset(str(folder), min_faces=1)
    assert reads == [str(changed)]


def test_another_network_reuses_the_faces_found(
    tmp_path: Path, data_home: str, cache_dir: Path, computed: list[str], detections: list[int]
) -> None:
    folder = _copy_people(data_home, tmp_path / "faces")
    first = load_dataset(str(folder), min_faces=1, encoder=FakeEncoder("a"))
    detections.clear()
    other = FakeEncoder("b")  # another network: its descriptors are computed, from the boxes already found
    second = load_dataset(str(folder), min_faces=1, encoder=other)
    assert other.calls == second.n_images and detections == []
    np.testing.assert_array_equal(first.images, second.images)


def _rows(cache_dir: Path, length: int) -> list[tuple[str, bytes]]:
    with sqlite3.connect(cache_dir / CACHE_FILE) as db:
        return db.execute("SELECT key, value FROM entries WHERE length(value) = ?", (length,)).fetchall()


def test_a_damaged_or_partial_entry_is_recomputed(
    tmp_path: Path, data_home: str, cache_dir: Path, computed: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    folder = _copy_people(data_home, tmp_path / "faces")
    first = load_dataset(str(folder), min_faces=1, encoder=FakeEncoder())
    (k1, v1), (k2, v2) = _rows(cache_dir, 4 * FakeEncoder.dimension)[:2]
    with sqlite3.connect(cache_dir / CACHE_FILE) as db:
        db.execute("UPDATE entries SET value = ? WHERE key = ?", (bytes([v1[0] ^ 1]) + v1[1:], k1))  # a flipped bit
        db.execute("UPDATE entries SET value = ? WHERE key = ?", (v2[:5], k2))  # cut short
    computed.clear()
    again = load_dataset(str(folder), min_faces=1, encoder=(enc := FakeEncoder()))
    assert len(computed) == 2 and enc.calls == 2  # those two images only
    assert "2 altered entries" in caplog.text
    _same(first, again)
    computed.clear()
    load_dataset(str(folder), min_faces=1, encoder=FakeEncoder())
    assert computed == []  # rewritten intact


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_cache_file_is_moved_aside_and_replaced(
    tmp_path: Path,
    data_home: str,
    cache_dir: Path,
    computed: list[str],
    caplog: pytest.LogCaptureFixture,
    damage: str,
) -> None:
    folder = _copy_people(data_home, tmp_path / "faces")
    first = load_dataset(str(folder), min_faces=1)
    db = cache_dir / CACHE_FILE
    with sqlite3.connect(db) as conn:  # everything in the main file, so that damaging it damages the data
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = db.read_bytes()
    db.write_bytes(b"not a database" * 500 if damage == "garbage" else data[: len(data) // 2])
    computed.clear()
    _same(first, load_dataset(str(folder), min_faces=1))
    assert len(computed) == 8
    assert "damaged" in caplog.text and list(cache_dir.glob(f"{CACHE_FILE}.damaged-*"))
    computed.clear()
    load_dataset(str(folder), min_faces=1)
    assert computed == []  # the new cache holds them


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    writer = textwrap.dedent(
        """
        import sys
        from peep.server.facecache import FaceCache
        folder, name = sys.argv[1], sys.argv[2]
        with FaceCache(folder) as cache:
            for i in range(100):
                cache.put({f"{name}-{i}": name.encode() * 100, "shared": b"the same value"})
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(tmp_path), n]) for n in ("one", "two")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with FaceCache(tmp_path) as cache:
        keys = [f"{n}-{i}" for n in ("one", "two") for i in range(100)]
        got = cache.get([*keys, "shared"])
        assert len(got) == 201 and cache.n_rejected == 0
        assert got["two-99"] == b"two" * 100 and got["shared"] == b"the same value"


def test_a_process_asking_for_faces_another_is_computing_waits_and_computes_none(
    tmp_path: Path, data_home: str, cache_dir: Path, computed: list[str]
) -> None:
    """The suite's workers start together and ask for the same public faces: the second waits for the first's
    computing and takes its results instead of computing them again on the same cores."""
    folder = _copy_people(data_home, tmp_path / "faces")
    first = textwrap.dedent(
        """
        import sys, time
        from peep.server.datasets import load_dataset
        from peep.server.facecache import FaceCache
        with FaceCache(sys.argv[1]) as cache, cache.computing() as held:
            print("held" if held else "not held", flush=True)
            time.sleep(1.0)  # the other process asks now, while nothing is cached yet
            load_dataset(sys.argv[2], min_faces=1, jobs=1)  # computes inside its own lock: no wait for itself
        """
    )
    env = {**os.environ, "PEEP_CACHE_DIR": str(cache_dir)}
    proc = subprocess.Popen([sys.executable, "-c", first, str(cache_dir), str(folder)], stdout=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        second = load_dataset(str(folder), min_faces=1, jobs=1)
        waited = time.monotonic() - t0
    finally:
        rc = proc.wait(timeout=120)
        proc.stdout.close()
    assert rc == 0
    assert computed == []  # every image came from the first process's computing
    assert waited >= 0.5 and second.images.shape[0] >= 6


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["dlib", "onnxruntime"])
def test_parallel_workers_compute_what_this_process_computes(
    data_home: str, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Eight real LFW images through dlib's network on each back end: in two worker processes (batches of four)
    and here (one batch of eight), bit for bit."""
    from peep.edge.embedding import make_encoder

    src = Path(data_home) / "lfw_home" / "lfw_funneled"
    files = [f for person in PEOPLE for f in sorted((src / person).glob("*.jpg"))[:4]]
    encoder, detector = make_encoder(backend), HaarFaceDetector()
    serial = facework.process_files(files, geometry=DEFAULT_GEOMETRY, detector=detector, encoder=encoder, jobs=1)
    # Two chunks of four, and no minimum amount of work: two workers run.
    monkeypatch.setattr(facework, "CHUNK", 4)
    monkeypatch.setattr(facework, "_POOL_MIN_SECONDS", 0.0)
    pools: list[int] = []
    real_pool = facework._compute_in_pool

    def pool_spy(*args: Any) -> int:
        pools.append(args[3])  # the number of workers
        return real_pool(*args)

    monkeypatch.setattr(facework, "_compute_in_pool", pool_spy)
    seen: list[tuple[int, int]] = []
    parallel = facework.process_files(
        files,
        geometry=DEFAULT_GEOMETRY,
        detector=detector,
        encoder=encoder,
        jobs=2,
        progress=lambda done, total: seen.append((done, total)),
    )
    assert pools == [2] and seen == [(0, 8), (4, 8), (8, 8)]
    assert serial.ok.sum() >= 6 and serial.descriptors is not None
    np.testing.assert_array_equal(parallel.ok, serial.ok)
    np.testing.assert_array_equal(parallel.faces, serial.faces)
    np.testing.assert_array_equal(parallel.descriptors, serial.descriptors)


def test_progress_off_a_terminal_is_a_line_per_ten_percent(
    tmp_path: Path, data_home: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(facework, "CHUNK", 1)  # progress comes per chunk: one image each, a line per 10 %
    folder = _copy_people(data_home, tmp_path / "faces", {"Al_Gore": 5, "Ahmed_Chalabi": 5})
    out = io.StringIO()
    with Progress("finding faces", stream=out, line_interval=0.0) as bar:
        load_dataset(str(folder), min_faces=1, encoder=FakeEncoder(), progress=bar.update)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0].startswith("finding faces: 0/10 (0%)") and lines[-1].startswith("finding faces: 10/10 (100%) in ")
    assert [line.split("(")[1].split(")")[0] for line in lines] == [f"{p}%" for p in range(0, 101, 10)]
    # Everything cached: nothing to report.
    again = io.StringIO()
    with Progress("finding faces", stream=again) as bar:
        load_dataset(str(folder), min_faces=1, encoder=FakeEncoder(), progress=bar.update)
    assert again.getvalue() == ""


@pytest.mark.slow
def test_the_faces_of_a_chunk_are_described_in_one_batch_with_the_bits_of_one_at_a_time(data_home: str) -> None:
    """onnxruntime's network runs once per chunk of faces; each descriptor is the one encode gives alone."""
    import cv2
    from peep.edge.embedding import OnnxResNetEncoder

    src = Path(data_home) / "lfw_home" / "lfw_funneled"
    files = [str(f) for person in PEOPLE for f in sorted((src / person).glob("*.jpg"))[:4]]
    encoder = OnnxResNetEncoder()
    batches: list[int] = []
    real = encoder.encode_many

    def counted(faces: Any) -> NDArray[np.float32]:
        batches.append(len(faces))
        return real(faces)

    encoder.encode_many = counted  # type: ignore[method-assign]
    steps = facework._Steps(HaarFaceDetector(), DEFAULT_GEOMETRY, encoder)
    results = facework.process_images([(f, True, True, None, None) for f in files], steps)
    found = [r for r in results if r.status == "face"]
    assert len(found) >= 6 and batches == [len(found)]
    for path, res in zip(files, results, strict=True):
        if res.status != "face":
            assert res.descriptor is None
            continue
        assert res.box is not None and res.descriptor is not None and res.face is not None
        alone = encoder.encode(
            cv2.imread(path, cv2.IMREAD_COLOR),
            FaceBox(**dict(zip(("x", "y", "w", "h", "score"), res.box, strict=True))),
        )
        np.testing.assert_array_equal(res.descriptor, alone)
    # Without a descriptor wanted the network does not run.
    batches.clear()
    assert all(r.descriptor is None for r in facework.process_images([(files[0], True, False, None, None)], steps))
    assert batches == []
