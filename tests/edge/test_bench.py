"""The edge section of `peep bench`: runs end to end and reports what it measured on."""

from __future__ import annotations

import pytest
from peep.edge.bench import run


@pytest.mark.slow
def test_quick_bench_reports_fps_stages_and_memory(data_home):
    r = run(quick=True)
    assert r["frames"] == r["video"]["frames"] == 150
    assert r["fps_640x480"] > 0 and r["rss_mb"] > r["rss_breakdown_mb"]["interpreter"]
    assert set(r["stage_ms"]) == {"decode", "detect", "track", "project", "perturb", "spool", "publish"}
    assert all(v > 0 for v in r["stage_ms"].values())
    # Every released template went through the real SQLite spool to the publisher.
    assert r["releases"] > 0 and r["delivered"] == r["releases"]
    assert r["video"]["faces_per_frame_max"] == 3 and r["detector"]["kind"] == "haar"
    assert r["payload_bytes_mean"] < 2 * 4 * r["bundle"]["n_components"]
