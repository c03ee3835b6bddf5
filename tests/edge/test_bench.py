"""The edge section of `peep bench`: runs end to end and reports what it measured on."""

from __future__ import annotations

import pytest
from peep.edge.bench import run

# The benches pin themselves to cores and compare timings measured in one run: on one xdist worker, one at a time.
pytestmark = [pytest.mark.bench, pytest.mark.xdist_group("bench")]


@pytest.mark.slow
def test_quick_bench_reports_fps_stages_and_memory(data_home):
    r = run(quick=True)
    assert r["frames"] == r["video"]["frames"] == 150
    assert r["fps_640x480"] > 0 and r["rss_mb"] > r["rss_breakdown_mb"]["interpreter"]
    # Where the memory goes: per phase, per library, and nothing an MQTT-only agent does not need.
    assert list(r["rss_breakdown_mb"]) == [
        "interpreter", "imports", "bundle_loaded", "pipeline_ready", "video_open", "first_frame", "end"
    ]  # fmt: skip
    assert {"numpy", "opencv", "onnxruntime", "cryptography", "pydantic", "paho_mqtt_ssl"} <= set(r["rss_imports_mb"])
    assert sum(r["rss_imports_mb"].values()) <= r["rss_breakdown_mb"]["imports"]
    assert r["not_needed_loaded"] == [] and r["dlib_resnet"]["not_needed_loaded"] == []
    assert set(r["stage_ms"]) == {"decode", "detect", "track", "project", "perturb", "spool", "publish"}
    assert all(v > 0 for v in r["stage_ms"].values())
    # Every released template went through the real SQLite spool to the publisher.
    assert r["releases"] > 0 and r["delivered"] == r["releases"]
    assert r["video"]["faces_per_frame_max"] == 3 and r["detector"]["kind"] == "haar"
    assert r["payload_bytes_mean"] < 2 * 4 * r["bundle"]["n_components"]
    # The descriptor run (the dlib extra is installed by scripts/bootstrap.sh): same video, a dlib-resnet bundle.
    d = r["dlib_resnet"]
    assert "error" not in d, d
    assert d["bundle"]["projection"] == "dlib-resnet" and d["mechanism"]["kind"] == "privunit"
    assert d["releases"] > 0 and d["delivered"] == d["releases"] and d["frames"] == 150
    # The descriptor runs per release (refine + alignment + network + PCA), not per frame.
    assert d["descriptor_ms_per_release"] == d["stage_ms"]["project"] > 0
    # Both back ends of the descriptor on the same faces, back to back: the same numbers, onnxruntime faster.
    t = r["descriptor"]
    assert t["faces"] >= 10 and t["max_abs_difference"] <= 1e-4 and t["min_cosine"] > 0.99999
    assert t["ms_per_face"]["onnxruntime"]["cpu_ms"] < t["ms_per_face"]["dlib"]["cpu_ms"]
    assert t["speedup_cpu"] == pytest.approx(
        t["ms_per_face"]["dlib"]["cpu_ms"] / t["ms_per_face"]["onnxruntime"]["cpu_ms"], rel=0.01
    )
    assert d["rss_breakdown_mb"]["bundle_loaded"] > r["rss_breakdown_mb"]["bundle_loaded"]  # the network is loaded
    pi = d["raspberry_pi_4_estimate"]
    assert pi["descriptor_ms_per_release"] == pytest.approx(
        d["descriptor_ms_per_release"] * pi["assumed_per_core_ratio"]
    )
    assert d["payload_bytes_mean"] < r["payload_bytes_mean"]  # 16 values instead of 128
