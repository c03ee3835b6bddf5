"""What the console shows of decisions made on devices: each device's decision mode and the model it holds (from
its report), and the device models this server issued with the calibration set they carry.

A device's report is a claim of a possibly hostile peer: :mod:`peep.core.reports` bounds it, and this module
reads only the fields it knows, each again bounded (a short mode, a version name, finite numbers), so an odd
report shows as "–", never as an error or as markup.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

_VERSION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _number(part: Mapping[str, Any], key: str, *, low: float = 0.0, high: float = 1e15) -> float | None:
    v = part.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not low <= v <= high:
        return None
    return float(v)


def age_text(seconds: float | None) -> str:
    """A duration as an operator reads it: ``45 s``, ``12 min``, ``5.2 h``, ``3.1 days``; ``–`` when unknown.

    >>> age_text(45), age_text(720), age_text(5.2 * 3600), age_text(3.1 * 86400), age_text(None)
    ('45 s', '12 min', '5.2 h', '3.1 days', '–')
    """
    if seconds is None or not math.isfinite(seconds):
        return "–"
    s = abs(seconds)
    if s < 120:
        text = f"{s:.0f} s"
    elif s < 7200:
        text = f"{s / 60:.0f} min"
    elif s < 2 * 86400:
        text = f"{s / 3600:.1f} h"
    else:
        text = f"{s / 86400:.1f} days"
    return text if seconds >= 0 else f"{text} ago"


def report_decision(report: Any, now: float) -> dict[str, Any] | None:
    """A device report's ``decision`` part as the Devices page shows it; None when the report has none.

    Returns
    -------
    dict or None
        ``mode`` ("device" or "server"), ``serial`` (int or None), ``version`` (str), ``age`` (since the model
        was trained), ``expires_in`` (negative: expired), ``expired`` (bool or None), ``epsilon_label``,
        ``flip_probability``, ``fpir_target`` and ``fpir_floor`` (the share of strangers the labels alone
        name), ``problem`` (why a device holding a model does not decide; "" when it does).
    """
    part = getattr(report, "decision", None)
    if not isinstance(part, Mapping):
        return None
    mode = part.get("mode")
    if mode not in ("device", "server"):
        return None
    serial = part.get("model_serial")
    version = part.get("model_version")
    trained = _number(part, "model_trained_at")
    expires = _number(part, "model_expires_at")
    return {
        "mode": mode,
        "serial": serial if isinstance(serial, int) and not isinstance(serial, bool) and serial >= 0 else None,
        "version": version if isinstance(version, str) and _VERSION.match(version) else "",
        "age": age_text(now - trained) if trained else "–",
        "expires_in": age_text(expires - now) if expires else "–",
        "expired": None if expires is None else expires <= now,
        "epsilon_label": _number(part, "epsilon_label", high=1e6),
        "flip_probability": _number(part, "flip_probability", high=1.0),
        "fpir_target": _number(part, "fpir_target", high=1.0),
        "fpir_floor": _number(part, "fpir_floor", high=1.0),
        "problem": part.get("problem") if isinstance(part.get("problem"), str) else "",
    }


def issued_view(services: Any, now: float, *, limit: int = 20) -> dict[str, Any]:
    """The Models page's device-model section: whether models are issued (or why not), the calibration set,
    and the newest ``limit`` models issued (serial, version, bundle, key, issued, expires, erased, reason)."""
    dm = services.device_models
    status = dm.status()
    rows = []
    for m in dm.recent(limit):
        rows.append(
            {
                "serial": m.serial,
                "version": m.model_version,
                "bundle_id": m.bundle_id,
                "key_id": m.key_id or "none",
                "issued_at": m.issued_at,
                "expires_at": m.expires_at,
                "expires_in": age_text(m.expires_at - now),
                "expired": m.expires_at <= now,
                "subjects": m.subjects,
                "erased": m.erased,
                "reason": m.reason,
                "withdrawn_at": m.withdrawn_at,
                "calibration": m.calibration,
            }
        )
    newest = status["newest"]
    return {
        "enabled": status["enabled"],
        "disabled_reason": status["disabled_reason"],
        "last_error": status["last_error"],
        "calibration": status["calibration"],
        "newest_serial": newest.serial if newest is not None else None,
        "rows": rows,
        "fpir": services.config.training.device_models.fpir,
        "far": services.config.training.device_models.far,
        "valid": age_text(services.config.training.device_models.valid_s),
        "reissue": age_text(services.config.training.device_models.reissue_s),
    }
