"""`peep.lab.bench.server.run(quick=True)`: every number is measured on the real path and nothing is lost."""

from __future__ import annotations

import math

import pytest
from peep_testing.server import mqtt_available

# The benches pin themselves to cores and compare timings measured in one run: on one xdist worker, one at a time.
pytestmark = [pytest.mark.bench, pytest.mark.xdist_group("bench")]


@pytest.mark.slow
def test_quick_bench_measures_every_number():
    from peep.lab.bench.server import run

    out = run(quick=True)
    keys = ("ingest_per_s_grpc", "identify_p50_ms", "identify_p99_ms", "identify_batch_per_s",
            "identify_tracks_batch_per_s", "ingest_decided_per_s", "train_s_10k")  # fmt: skip
    for k in keys:
        assert isinstance(out[k], float) and math.isfinite(out[k]) and out[k] > 0, (k, out[k])
    assert out["identify_p50_ms"] <= out["identify_p99_ms"]
    ctx = out["context"]
    assert ctx["grpc"]["templates"] == 6000  # every streamed template validated and stored
    assert ctx["train"]["templates"] == 10_000 and ctx["train"]["dims"] == 128
    # Every end-to-end number is the median of its repeats, which are all reported with the spread.
    rep = out["repeats"]
    for k in ("ingest_per_s_grpc", "identify_p50_ms", "identify_p99_ms", "identify_batch_per_s"):
        runs = rep[k]["runs"]
        assert len(runs) == ctx["repeats"] == 3
        assert rep[k]["median"] == out[k] and min(runs) <= out[k] <= max(runs)
        assert rep[k]["spread"] == pytest.approx((max(runs) - min(runs)) / out[k])
    assert rep["identify_p99_ms"]["worst"] == max(rep["identify_p99_ms"]["runs"])
    assert rep["ingest_per_s_grpc"]["worst"] == min(rep["ingest_per_s_grpc"]["runs"])
    assert all(r["stored"] == 6000 for r in ctx["grpc"]["runs"])
    # Where the time goes: every stage timed, and the clients' CPU reported.
    stages = ctx["stages_us"]
    for k in ("parse", "validate", "authorise", "record", "commit", "server_cpu_end_to_end", "transport_rest"):
        assert stages["ingest_grpc_per_template"][k] >= 0
    assert stages["ingest_grpc_per_template"]["validate"] > 0 and stages["ingest_grpc_per_template"]["commit"] > 0
    for k in ("parse", "validate_authorise", "onnx", "respond", "handler_mean", "client_p50"):
        assert stages["identify_per_call"][k] > 0
    assert ctx["cpu"]["grpc_ingest"]["client_util"] > 0 and ctx["cpu"]["identify"]["client_util"] > 0
    assert "cpu_affinity" in ctx["pinning"] and ctx["pinning"]["blas_threads"] == 1
    assert set(out["targets_met"]) >= {"identify_p99_ms_median", "ingest_per_s_grpc_worst"}
    if mqtt_available() is None:
        assert out["ingest_per_s_mqtt"] > 0
        assert ctx["mqtt"]["stored"] == ctx["mqtt"]["sent"] and ctx["mqtt"]["lost"] == 0
        assert len(rep["ingest_per_s_mqtt"]["runs"]) == 3
        assert "mqtt_topic" in stages["ingest_mqtt_per_template"]
        # Nothing left on the broker under the roots the runs used (unique per run).
        assert ctx["mqtt"]["broker_left"] and all(v == [] for v in ctx["mqtt"]["broker_left"].values())
