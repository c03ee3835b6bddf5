"""The `peep` CLI contracts from docs/DESIGN.md: keys, bundle build/verify, bench; exit codes 0/1/2."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from peep.server.cli import main


def test_keys_generate_writes_private_0600_and_public(tmp_path, capsys):
    assert main(["keys", "generate", "--out", str(tmp_path / "site")]) == 0
    key = tmp_path / "site.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (tmp_path / "site.pub").is_file()
    assert "key id" in capsys.readouterr().out
    # Refusing to overwrite a key is a usage error (2), and says why.
    assert main(["keys", "generate", "--out", str(tmp_path / "site")]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err


def test_bundle_build_and_verify_on_a_folder_dataset(tmp_path, data_home, capsys):
    # A folder-per-identity dataset made of real LFW images (3 people).
    src = Path(data_home) / "lfw_home" / "lfw_funneled"
    ds = tmp_path / "faces"
    for person in ("Ai_Sugiyama", "Ahmed_Chalabi", "Alastair_Campbell"):
        shutil.copytree(src / person, ds / person)
    assert main(["keys", "generate", "--out", str(tmp_path / "k")]) == 0
    out = tmp_path / "bundle"
    rc = main(
        [
            "bundle",
            "build",
            "--dataset",
            str(ds),
            "--min-faces",
            "2",
            "--projection",
            "eigenfaces",
            "--components",
            "8",
            "--size",
            "40x50",
            "--signing-key",
            str(tmp_path / "k.key"),
            "--out",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    md = json.loads((out / "metadata.json").read_text())
    assert md["geometry"]["width"] == 40 and md["geometry"]["height"] == 50 and md["n_components"] == 8
    assert md["provenance"]["n_subjects"] == 3
    assert main(["bundle", "verify", str(out), "--public-key", str(tmp_path / "k.pub")]) == 0
    assert "OK" in capsys.readouterr().out
    data = bytearray((out / "projector.onnx").read_bytes())
    data[100] ^= 0xFF
    (out / "projector.onnx").write_bytes(bytes(data))
    assert main(["bundle", "verify", str(out), "--public-key", str(tmp_path / "k.pub")]) == 1
    assert "projector.onnx" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["bundle", "build", "--dataset", "/nonexistent", "--components", "8", "--signing-key", "K", "--out", "O"],
            "--signing-key",
        ),
        (
            [
                "bundle",
                "build",
                "--dataset",
                "lfw",
                "--components",
                "8",
                "--size",
                "47by62",
                "--signing-key",
                "K",
                "--out",
                "O",
            ],
            "WIDTHxHEIGHT",
        ),
        (["bundle", "verify", "/tmp/x", "--public-key", "/nonexistent.pub"], "--public-key"),
        (["bench", "--out", "x.json", "--sections", "gpu"], "--sections"),
    ],
)
def test_usage_errors_exit_2_and_name_the_option(argv, needle, capsys):
    with pytest.raises(SystemExit) if "47by62" in argv else _nullcontext():
        rc = main(argv)
        assert rc == 2
    assert needle in capsys.readouterr().err


def test_missing_dataset_folder_is_a_usage_error(tmp_path, capsys):
    assert main(["keys", "generate", "--out", str(tmp_path / "k")]) == 0
    rc = main(
        [
            "bundle",
            "build",
            "--dataset",
            str(tmp_path / "none"),
            "--components",
            "4",
            "--signing-key",
            str(tmp_path / "k.key"),
            "--out",
            str(tmp_path / "b"),
        ]
    )
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


def test_console_script_is_installed_and_runs():
    exe = Path(sys.executable).parent / "peep"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 0
    for command in ("keys", "bundle", "bench"):
        assert command in out.stdout


def test_bench_quick_core_section_schema(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--out", str(out), "--quick", "--sections", "core"]) == 0
    data = json.loads(out.read_text())
    core = data["core"]
    for key in (
        "release_us_per_face",
        "release_us_per_face_batch",
        "project_us_per_face",
        "naive_paper_us_per_face",
        "opendp_release_us_per_face",
    ):
        assert isinstance(core[key], float) and core[key] > 0, key
    assert core["release_sampler"] == "SecureSampler"
    # Batching amortises per-call overhead: per-face cost in a batch is below a single call's.
    assert core["release_us_per_face_batch"] < core["release_us_per_face"]


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
