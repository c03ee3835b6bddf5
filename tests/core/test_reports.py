"""Device reports (peep.core.reports): what a device may tell the server, bounded like every peer's input."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from peep.core.reports import MAX_REPORT_BYTES, DeviceReport, ReportError, parse_device_report

GOOD = DeviceReport(
    at=1795694855.5, bundle_id="eb-83f3b202ae3a07974e48", mechanism="privunit", epsilon_vector=16.0,
    epsilon_coordinate=16.0, epsilon_vector_per_release=18.0, track_budget_vector=36.0, device_budget_vector=None,
    releases=120, epsilon_vector_spent=2160.0, suppressed={"budget": 3, "rate": 40},
)  # fmt: skip


def _doc(**over):
    doc = json.loads(GOOD.to_json())
    doc.update(over)
    return json.dumps(doc).encode()


def test_a_report_round_trips_and_counts_its_suppressions():
    got = parse_device_report(GOOD.to_json())
    assert got == GOOD and got.n_suppressed == 43 and len(GOOD.to_json()) < 400


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"\xff\xfe", "UTF-8 JSON object"),
        (b"[1, 2]", "expected a JSON object, received list"),
        (b"x" * (MAX_REPORT_BYTES + 1), f"at most {MAX_REPORT_BYTES} bytes"),
        (_doc(v=2), "v: expected 1"),
        (_doc(face=[0.1, 0.2]), r"unknown fields \['face'\]"),
        (_doc(releases=-1), r"releases: expected a whole number"),
        (_doc(releases=1.5), r"releases: expected a whole number"),
        (_doc(releases=True), r"releases: expected a whole number"),
        (_doc(epsilon_vector="16"), r"epsilon_vector: expected a finite number"),
        (_doc(epsilon_vector_spent=1e300), r"epsilon_vector_spent: expected a finite number"),
        (_doc(epsilon_vector=float("nan")), r"epsilon_vector: expected a finite number"),
        (_doc(mechanism="<script>"), r"mechanism: expected a short name"),
        (_doc(bundle_id="eb-1/../../x"), r"bundle_id: expected a short name"),
        (_doc(suppressed={"Rate Limit": 1}), r"suppressed: expected a short name"),
        (_doc(suppressed={f"r{i}": 1 for i in range(17)}), r"at most 16 reason"),
        (_doc(suppressed={"rate": -3}), r"suppressed.rate: expected a whole number"),
        (_doc(track_budget_vector=-1.0), r"track_budget_vector: expected a finite number"),
    ],
)
def test_a_bad_report_is_refused_naming_the_field(payload, match):
    with pytest.raises(ReportError, match=match):
        parse_device_report(payload)


def test_a_budget_may_be_absent_but_not_anything_else():
    assert parse_device_report(_doc(track_budget_vector=None)).track_budget_vector is None
    with pytest.raises(ReportError, match="releases"):
        parse_device_report(_doc(releases=None))


def test_insecure_broker_is_optional_false_when_absent_and_sent_only_when_true():
    """A door deciding over MQTT on a broker without TLS or credentials says so; every older report stays valid."""
    assert "insecure_broker" not in json.loads(GOOD.to_json())  # a server that predates the key still reads it
    assert parse_device_report(GOOD.to_json()).insecure_broker is False
    warned = replace(GOOD, insecure_broker=True)
    assert json.loads(warned.to_json())["insecure_broker"] is True
    assert parse_device_report(warned.to_json()) == warned
    assert parse_device_report(_doc(insecure_broker=False)).insecure_broker is False


@pytest.mark.parametrize("value", ["true", 1, 0, None, [True], {"tls": False}])
def test_insecure_broker_must_be_a_json_boolean(value):
    with pytest.raises(ReportError, match=r"^insecure_broker: expected true or false .*received "):
        parse_device_report(_doc(insecure_broker=value))


def test_a_decision_part_carries_the_fpir_floor_and_a_bounded_problem():
    from peep.core.reports import MAX_PROBLEM_CHARS

    problem = "fpir: the model's target 0.001 is at or below the FPIR floor"
    part = {"mode": "device", "model_serial": None, "epsilon_label": 8.0, "fpir_target": 0.001,
            "fpir_floor": 0.0033, "problem": problem}  # fmt: skip
    got = parse_device_report(replace(GOOD, decision=part).to_json()).decision
    assert got["fpir_floor"] == 0.0033 and got["fpir_target"] == 0.001 and got["problem"].startswith("fpir:")
    for bad, match in [
        ({**part, "fpir_floor": 1.5}, "decision.fpir_floor: expected a probability"),
        ({**part, "problem": "x" * (MAX_PROBLEM_CHARS + 1)}, "decision.problem: expected printable text"),
        ({**part, "problem": "line\nbreak"}, "decision.problem: expected printable text"),
        ({**part, "problem": 7}, "decision.problem: expected printable text"),
    ]:
        doc = json.loads(GOOD.to_json())
        doc["decision"] = bad
        with pytest.raises(ReportError, match=match):
            parse_device_report(json.dumps(doc).encode())
