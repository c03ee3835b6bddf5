"""``peep bench --sections door``: a door's claim → lock latency per bundle and transport, every stage measured."""

from __future__ import annotations

import json

import pytest
from peep_server_testlib import mqtt_available


def test_quick_door_section_times_every_stage(tmp_path, data_home, monkeypatch):
    pytest.importorskip("dlib", reason="the dlib-resnet bundle needs peep-edge[dlib], which scripts/test.sh installs")
    from peep.server.cli import main

    monkeypatch.setenv("SCIKIT_LEARN_DATA", data_home)
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--sections", "door", "--out", str(out)]) == 0
    door = json.loads(out.read_text())["door"]
    assert "error" not in door, door
    transports = ["grpc"] + (["mqtt"] if mqtt_available() is None else [])
    assert door["mqtt"] is (mqtt_available() is None)
    for projection in ("dlib-resnet", "fisherfaces"):
        b = door["bundles"][projection]
        for t in transports:
            r = b[t]
            assert r["claims"] == door["claims_per_run"] and r["decided"] >= r["claims"] - 2, r
            st = r["stages_ms"]
            for stage in ("face_search", "descriptor", "perturb", "encode", "transport", "server_score", "return",
                          "actuate", "face_to_lock", "claim_to_lock"):  # fmt: skip
                assert st[stage]["n"] > 0 and 0 <= st[stage]["p50"] <= st[stage]["p95"] <= st[stage]["worst"], stage
            # The round trip splits into its parts on the one clock; the face to lock holds them all.
            parts = st["transport"]["p50"] + st["server_score"]["p50"] + st["return"]["p50"]
            assert parts == pytest.approx(st["verify_round_trip"]["p50"], rel=0.5, abs=5.0)
            assert st["face_to_lock"]["p50"] >= st["descriptor"]["p50"]
            assert r["agent_cpus"] == 1 and isinstance(r["target_met"], bool)
    # A descriptor network costs more than a linear projection of pixels.
    assert (door["bundles"]["dlib-resnet"]["grpc"]["stages_ms"]["descriptor"]["p50"]
            > door["bundles"]["fisherfaces"]["grpc"]["stages_ms"]["descriptor"]["p50"])  # fmt: skip
