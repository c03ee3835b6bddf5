"""``peep bench --sections cluster``: three replicas, every number measured, nothing left on the broker."""

from __future__ import annotations

import json

import pytest
from peep.server.cli import main
from peep_testing.server import PG_BASE, mqtt_available

# The benches pin themselves to cores and compare timings measured in one run: on one xdist worker, one at a time.
pytestmark = [pytest.mark.bench, pytest.mark.xdist_group("bench")]


def test_cluster_section_names_the_missing_service(tmp_path, monkeypatch, capsys):
    out = tmp_path / "b.json"
    monkeypatch.setenv("PEEP_BENCH_PG_DSN", "host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1")
    assert main(["bench", "--sections", "cluster", "--out", str(out)]) == 1
    err = json.loads(out.read_text())["cluster"]["error"]
    assert "needs PostgreSQL" in err and "PEEP_BENCH_PG_DSN" in err
    monkeypatch.delenv("PEEP_BENCH_PG_DSN")
    monkeypatch.setenv("PEEP_BENCH_MQTT", "127.0.0.1:1")
    assert main(["bench", "--sections", "cluster", "--out", str(out)]) == 1
    err = json.loads(out.read_text())["cluster"]["error"]
    assert "needs an MQTT v5 broker" in err and "PEEP_BENCH_MQTT" in err and "127.0.0.1:1" in err


def test_default_sections_leave_the_cluster_out():
    from peep.lab.commands.bench import DEFAULT_SECTIONS, SECTIONS

    assert "cluster" in SECTIONS and "cluster" not in DEFAULT_SECTIONS


@pytest.mark.slow
def test_quick_cluster_section(pg_admin, monkeypatch):
    if mqtt_available() is not None:
        pytest.skip(mqtt_available())
    monkeypatch.setenv("PEEP_BENCH_PG_DSN", PG_BASE)  # the database pg_admin looks in
    from peep.lab.bench.cluster import run
    from peep.lab.processes.retained import retained_topics

    out = run(quick=True)
    assert out["replicas"] == 3
    assert out["sent"] == out["stored"] == out["distinct_stored"] == 6000 and out["duplicates"] == 0
    assert out["ingest_per_s_1"] > 0 and out["ingest_per_s_n"] > 0
    assert 0 < out["context"]["train_s"] <= out["promotion_to_serving_s"]
    assert out["context"]["after_train_s"] < 5.0
    # Through the shipped HAProxy configuration, replica B killed and restarted mid-way: every template decided
    # once (where haproxy is installed; the section says why not elsewhere).
    tb = out["through_balancer"]
    from peep.lab.processes.haproxy import haproxy_missing

    if haproxy_missing() is None:
        assert tb["sent"] == tb["decided"] > 0 and tb["duplicates"] == tb["lost"] == 0, tb
        assert all(n > 0 for n in tb["calls_per_replica"].values()), tb
        # The killed replica held the subscriber's stream: it called again with its last seq and missed nothing.
        ev = tb["events_followed"]
        assert ev["received"] == ev["distinct"] == ev["expected"] == tb["sent"] and ev["repeats"] == 0, ev
        assert ev["in_commit_order"] and ev["called_again"] >= 1 and ev["lag_ms"]["p50"] is not None, ev
    else:
        assert tb == {"error": haproxy_missing()}
    cpu = out["server_cpu_s_per_1k"]
    assert cpu["decided"] > 0 and set(cpu["per_replica"]) == {"a", "b", "c"}
    assert cpu["decided"] == pytest.approx(sum(cpu["per_replica"].values()), abs=0.01)
    assert all(n >= 1 for n in cpu["replicas_for_1k_per_s"].values())
    root = out["context"]["broker"].split("topic root ")[1].rstrip(")")
    assert retained_topics(f"{root}/#") == {}  # the bundle announcement cleared; sessions had expiry 0
    schema = out["context"]["schema"]
    assert pg_admin.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchall() == []
