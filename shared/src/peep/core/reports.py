"""A device's report: what its release policy did and the budgets it enforces, as bounded JSON.

The server cannot see what a device decided *not* to release (a ready face
the rate limit or an ε budget suppressed), nor the budgets in the device's
own configuration; the device says so in a small retained MQTT message on
``<root>/<site>/<device>/report`` (:meth:`peep.core.topics.TopicScheme.report`)
every ``mqtt.report_interval_s``. Every field is a count, an ε or a short
name: no face, no track id, no subject. The server treats it as a claim of a
possibly hostile peer: :func:`parse_device_report` bounds the size, the keys,
every number and every name, and refuses anything else with a
:class:`ReportError` naming what is wrong.

Payload (UTF-8 JSON object, at most :data:`MAX_REPORT_BYTES`)::

    {"v": 1, "at": 1795694855.9, "bundle_id": "eb-…", "mechanism": "privunit",
     "epsilon_vector": 16.0, "epsilon_coordinate": 16.0, "epsilon_vector_per_release": 18.0,
     "track_budget_vector": 36.0, "device_budget_vector": null,
     "releases": 120, "epsilon_vector_spent": 2160.0, "suppressed": {"rate": 40, "budget": 3}}

``epsilon_vector_per_release`` is the face's per-vector ε plus the soft
traits' (what one release costs its track); the budgets are per-vector ε
(``null``: none configured).

``insecure_broker`` (optional, ``true`` or ``false``; absent means ``false``):
the device is a door deciding claims over MQTT on a broker connection
without TLS or without credentials, which its configuration allowed
explicitly (``door.insecure_broker = true``): whoever can reach that broker
can read its claims and block or delay its decisions. A device sends the key
only when it is true, so its reports stay readable by servers that predate
it.

``decision`` (optional; absent for a device whose server decides): a device
deciding on its own clean projection with a signed device model says so, with
the model it holds (``null`` fields: none valid) and the ε of a released label::

    "decision": {"mode": "device", "model_serial": 12, "model_version": "v0007",
                 "model_trained_at": 1795690000.0, "model_expires_at": 1796294800.0,
                 "subjects": 10, "epsilon_label": 8.0, "flip_probability": 0.0034,
                 "fpir_target": 0.01, "fpir_floor": 0.0034}

``fpir_floor`` is the share of strangers the labels alone name (the model's FPIR target must lie above it);
``problem`` says why a device with a model does not decide (e.g. a target below that floor).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Largest payload accepted (a report is ~300 bytes).
MAX_REPORT_BYTES = 2048
#: Most suppression reasons listed.
MAX_REASONS = 16
#: Largest count or ε accepted: beyond any real device's lifetime, below float precision trouble.
MAX_NUMBER = 1e15
_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,31}")
_BUNDLE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_KEYS = frozenset(
    {
        "v",
        "at",
        "bundle_id",
        "mechanism",
        "epsilon_vector",
        "epsilon_coordinate",
        "epsilon_vector_per_release",
        "track_budget_vector",
        "device_budget_vector",
        "releases",
        "epsilon_vector_spent",
        "suppressed",
        "insecure_broker",
        "decision",
    }
)
#: Fields of a report's ``decision`` part.
DECISION_KEYS = (
    "mode",
    "model_serial",
    "model_version",
    "model_trained_at",
    "model_expires_at",
    "subjects",
    "epsilon_label",
    "flip_probability",
    "fpir_target",
    "fpir_floor",
    "problem",
)
#: Longest ``decision.problem`` (why a device holding a model does not decide) accepted.
MAX_PROBLEM_CHARS = 400
#: Keys a report may leave out, and their values then (a report older than the key is still one).
_OPTIONAL_FALSE = frozenset({"insecure_broker"})


class ReportError(ValueError):
    """A device report that is not one (names the field and what was expected)."""


@dataclass(frozen=True)
class DeviceReport:
    """One parsed, bounded device report (see the module docstring for the fields)."""

    at: float
    bundle_id: str
    mechanism: str
    epsilon_vector: float
    epsilon_coordinate: float
    epsilon_vector_per_release: float
    track_budget_vector: float | None
    device_budget_vector: float | None
    releases: int
    epsilon_vector_spent: float
    suppressed: Mapping[str, int] = field(default_factory=dict)
    #: A door deciding over MQTT on a broker without TLS or credentials (``door.insecure_broker``).
    insecure_broker: bool = False
    #: Decision mode and the device model held (see the module docstring); None when the server decides.
    decision: Mapping[str, Any] | None = None

    @property
    def n_suppressed(self) -> int:
        return sum(self.suppressed.values())

    def to_json(self) -> bytes:
        """The payload a device publishes (compact JSON, within :data:`MAX_REPORT_BYTES`)."""
        doc = {"v": 1, **{k: getattr(self, k) for k in sorted(_KEYS - {"v"})}}
        doc["suppressed"] = dict(self.suppressed)
        for key in _OPTIONAL_FALSE:
            if not doc[key]:
                del doc[key]  # left out when false: a server older than the key refuses unknown ones
        if self.decision is None:
            del doc["decision"]
        else:
            doc["decision"] = _decision(dict(self.decision))
        out = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
        if len(out) > MAX_REPORT_BYTES:
            raise ReportError(f"report: expected at most {MAX_REPORT_BYTES} bytes, built {len(out)}")
        return out


def _number(doc: Mapping[str, Any], key: str, *, optional: bool = False) -> float | None:
    v = doc.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= MAX_NUMBER:
        shown = repr(v)[:40]
        raise ReportError(f"{key}: expected a finite number in [0, {MAX_NUMBER:g}], received {shown}")
    return float(v)


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NUMBER:
        raise ReportError(f"{key}: expected a whole number in [0, {MAX_NUMBER:g}], received {repr(value)[:40]}")
    return int(value)


def _flag(doc: Mapping[str, Any], key: str) -> bool:
    v = doc.get(key, False)
    if not isinstance(v, bool):
        raise ReportError(f"{key}: expected true or false (or the key left out), received {repr(v)[:40]}")
    return v


def _name(value: Any, key: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ReportError(f"{key}: expected a short name matching {pattern.pattern}, received {repr(value)[:40]}")
    return value


def _decision(part: Any) -> dict[str, Any]:
    """A report's ``decision`` part, bounded (:class:`ReportError` naming the key)."""
    if not isinstance(part, dict):
        raise ReportError(f"decision: expected an object, received {type(part).__name__}")
    unknown = sorted(str(k)[:32] for k in part if k not in DECISION_KEYS)
    if unknown:
        raise ReportError(f"decision: unknown fields {unknown[:4]}")
    mode = part.get("mode")
    if mode not in ("device", "server"):
        raise ReportError(f"decision.mode: expected 'device' or 'server', received {repr(mode)[:20]}")
    out: dict[str, Any] = {"mode": mode}
    if part.get("model_serial") is not None:
        out["model_serial"] = _count(part["model_serial"], "decision.model_serial")
    if part.get("subjects") is not None:
        out["subjects"] = _count(part["subjects"], "decision.subjects")
    if part.get("model_version") is not None:
        out["model_version"] = _name(part["model_version"], "decision.model_version", _BUNDLE)
    for key in ("model_trained_at", "model_expires_at", "epsilon_label", "flip_probability", "fpir_target",
                "fpir_floor"):  # fmt: skip
        if part.get(key) is not None:
            out[key] = _number(part, key)
    for key in ("flip_probability", "fpir_target", "fpir_floor"):
        if out.get(key, 0.0) > 1.0:
            raise ReportError(f"decision.{key}: expected a probability, received {out[key]}")
    problem = part.get("problem")
    if problem is not None and problem != "":
        if not isinstance(problem, str) or len(problem) > MAX_PROBLEM_CHARS or not problem.isprintable():
            raise ReportError(f"decision.problem: expected printable text of at most {MAX_PROBLEM_CHARS} "
                              f"characters, received {repr(problem)[:40]}")  # fmt: skip
        out["problem"] = problem
    return out


def parse_device_report(payload: bytes) -> DeviceReport:
    """Parse and bound a report published by a device.

    Raises
    ------
    ReportError
        Too large, not a JSON object, an unknown or missing field, or a value out of bounds.
    """
    if len(payload) > MAX_REPORT_BYTES:
        raise ReportError(f"report: expected at most {MAX_REPORT_BYTES} bytes, received {len(payload)}")
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ReportError("report: expected a UTF-8 JSON object") from None
    if not isinstance(doc, dict):
        raise ReportError(f"report: expected a JSON object, received {type(doc).__name__}")
    unknown = sorted(str(k)[:32] for k in doc if k not in _KEYS)
    if unknown:
        raise ReportError(f"report: unknown fields {unknown[:4]}")
    if doc.get("v") != 1:
        raise ReportError(f"v: expected 1, received {repr(doc.get('v'))[:20]}")
    sup = doc.get("suppressed", {})
    if not isinstance(sup, dict) or len(sup) > MAX_REASONS:
        raise ReportError(f"suppressed: expected an object of at most {MAX_REASONS} reason: count pairs")
    suppressed = {_name(k, "suppressed", _NAME): _count(v, f"suppressed.{k}") for k, v in sup.items()}
    return DeviceReport(
        at=float(_number(doc, "at") or 0.0),
        bundle_id=_name(doc.get("bundle_id"), "bundle_id", _BUNDLE),
        mechanism=_name(doc.get("mechanism"), "mechanism", _NAME),
        epsilon_vector=float(_number(doc, "epsilon_vector") or 0.0),
        epsilon_coordinate=float(_number(doc, "epsilon_coordinate") or 0.0),
        epsilon_vector_per_release=float(_number(doc, "epsilon_vector_per_release") or 0.0),
        track_budget_vector=_number(doc, "track_budget_vector", optional=True),
        device_budget_vector=_number(doc, "device_budget_vector", optional=True),
        releases=_count(doc.get("releases"), "releases"),
        epsilon_vector_spent=float(_number(doc, "epsilon_vector_spent") or 0.0),
        suppressed=suppressed,
        insecure_broker=_flag(doc, "insecure_broker"),
        decision=_decision(doc["decision"]) if doc.get("decision") is not None else None,
    )
