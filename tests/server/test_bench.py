"""`peep.server.bench.server.run(quick=True)`: every number is measured on the real path and nothing is lost."""

from __future__ import annotations

import math

import pytest
from peep_server_testlib import mqtt_available


@pytest.mark.slow
def test_quick_bench_measures_every_number():
    from peep.server.bench.server import run

    out = run(quick=True)
    keys = ("ingest_per_s_grpc", "identify_p50_ms", "identify_p99_ms", "identify_batch_per_s", "train_s_10k")
    for k in keys:
        assert isinstance(out[k], float) and math.isfinite(out[k]) and out[k] > 0, (k, out[k])
    assert out["identify_p50_ms"] <= out["identify_p99_ms"]
    ctx = out["context"]
    assert ctx["grpc"]["templates"] == 6000  # every streamed template validated and stored
    assert ctx["train"]["templates"] == 10_000 and ctx["train"]["dims"] == 128
    if mqtt_available() is None:
        assert out["ingest_per_s_mqtt"] > 0
        assert ctx["mqtt"]["stored"] == ctx["mqtt"]["sent"] and ctx["mqtt"]["lost"] == 0
