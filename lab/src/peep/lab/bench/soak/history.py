"""The soak's checker: what happened, read from the history each party kept, not from counters.

Counters say how many; a history says which. Every template a device says it released (its ledger, its
spool's dead letters, what is still queued) is matched with what the server decided; every decision event
the server committed with what a subscriber following the balancer received; every door claim with its
outcome and every drive of the lock with an accepted decision for that claim. The functions here are pure:
the soak reads the devices' files, the database and its own logs, and hands the records over.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DeviceHistory:
    """What one device says it did.

    Attributes
    ----------
    device_id : str
    sent : frozenset of str
        Message ids of every release in its privacy ledger (the cost is charged before a template is queued,
        so a release the device made is there even when its process was killed right after).
    dead_letters : mapping of str to str
        Message id -> the reason its spool gave up on it.
    queued : frozenset of str
        Message ids still in its spool at the end (not acknowledged by a receiver).
    """

    device_id: str
    sent: frozenset[str]
    dead_letters: Mapping[str, str] = field(default_factory=dict)
    queued: frozenset[str] = frozenset()


def check_templates(
    devices: Iterable[DeviceHistory], decided: Iterable[tuple[str, str]]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Per device: sent, decided once, dead-lettered, still queued, lost, duplicated; and the totals.

    Parameters
    ----------
    devices : iterable of DeviceHistory
    decided : iterable of (device_id, message_id)
        One pair per decision the server committed (a template decided twice appears twice).

    Returns
    -------
    per_device : dict
        ``{device: {sent, decided_once, dead_lettered, queued, lost, duplicated, unknown, examples}}``:
        ``lost`` = sent, never decided, not dead-lettered and not queued; ``duplicated`` = decided more than
        once; ``unknown`` = decided but never sent by that device (a forged or misattributed id);
        ``examples`` lists a few message ids of each non-empty anomaly.
    totals : dict
        The same counts summed over devices.
    """
    counts = Counter(decided)
    per: dict[str, dict[str, Any]] = {}
    known: set[tuple[str, str]] = set()
    for dev in devices:
        keys = {(dev.device_id, m) for m in dev.sent}
        known |= keys
        once = {k for k in keys if counts.get(k, 0) == 1}
        dup = {k for k in keys if counts.get(k, 0) > 1}
        dead = {(dev.device_id, m) for m in dev.dead_letters} & keys
        queued = {(dev.device_id, m) for m in dev.queued} & keys
        lost = {k for k in keys if counts.get(k, 0) == 0} - dead - queued
        per[dev.device_id] = {
            "sent": len(keys),
            "decided_once": len(once),
            "dead_lettered": len(dead - once - dup),
            "dead_letter_reasons": dict(Counter(dev.dead_letters[m] for _, m in dead - once - dup)),
            "queued": len(queued - once - dup),
            "lost": len(lost),
            "duplicated": len(dup),
            "unknown": 0,
            "examples": {
                name: sorted(m for _, m in ids)[:5] for name, ids in (("lost", lost), ("duplicated", dup)) if ids
            },
        }
    for device, message in sorted(k for k in counts if k not in known):
        row = per.setdefault(device, {"sent": 0, "decided_once": 0, "dead_lettered": 0, "queued": 0,
                                      "lost": 0, "duplicated": 0, "unknown": 0, "examples": {}})  # fmt: skip
        row["unknown"] += 1
        examples = row["examples"].setdefault("unknown", [])
        if len(examples) < 5:
            examples.append(message)
    names = ("sent", "decided_once", "dead_lettered", "queued", "lost", "duplicated", "unknown")
    totals = {n: sum(int(r[n]) for r in per.values()) for n in names}
    return dict(sorted(per.items())), totals


def check_events(committed: Sequence[tuple[int, str]], received: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """What a subscriber received against what the server committed, both as ``(seq, event_id)``.

    Returns ``{expected, received, missing, repeats, out_of_order, unexpected}``: ``missing`` = committed
    (after the subscriber's first event, which is where it started following) and never received;
    ``repeats`` = deliveries of an event already received; ``out_of_order`` = deliveries whose ``seq`` is below
    the one before; ``unexpected`` = received but never committed.
    """
    if not received:
        return {"expected": len(committed), "received": 0, "missing": len(committed), "repeats": 0,
                "out_of_order": 0, "unexpected": 0}  # fmt: skip
    start = min(seq for seq, _ in received)
    expected = {e for seq, e in committed if seq >= start}
    seen: set[str] = set()
    repeats = out_of_order = 0
    last = None
    for seq, e in received:
        if e in seen:
            repeats += 1
        seen.add(e)
        if last is not None and seq < last:
            out_of_order += 1
        last = seq
    all_committed = {e for _, e in committed}
    return {
        "expected": len(expected),
        "received": len(received),
        "missing": len(expected - seen),
        "repeats": repeats,
        "out_of_order": out_of_order,
        "unexpected": len(seen - all_committed),
    }


def check_door(
    claims: Sequence[Mapping[str, Any]], lock_drives: Sequence[str], accepted: Iterable[str]
) -> dict[str, Any]:
    """Every claim ended, and the lock driven only for an accepted decision of that claim.

    Parameters
    ----------
    claims : sequence of mapping
        ``{"nonce", "outcome": "opened" | "refused" | "", "reason"}`` per claim the soak made ("" = never ended).
    lock_drives : sequence of str
        The claim nonce of every time the lock was driven open (the door's own record of it).
    accepted : iterable of str
        Nonces of the claims an accepted decision was made for (by the server, or by the device deciding).

    Returns
    -------
    dict
        ``{claims, opened, refused, unended, refused_without_reason, wrong_lock_drives, refusals}``:
        ``wrong_lock_drives`` = drives without an accepted decision for that claim, or more than one drive
        per claim.
    """
    ok = set(accepted)
    outcomes = Counter(str(c.get("outcome", "")) for c in claims)
    drives = Counter(lock_drives)
    wrong = sum(n for nonce, n in drives.items() if nonce not in ok) + sum(
        n - 1 for nonce, n in drives.items() if nonce in ok and n > 1
    )
    return {
        "claims": len(claims),
        "opened": outcomes.get("opened", 0),
        "refused": outcomes.get("refused", 0),
        "unended": sum(n for o, n in outcomes.items() if o not in ("opened", "refused")),
        "refused_without_reason": sum(1 for c in claims if c.get("outcome") == "refused" and not c.get("reason")),
        "wrong_lock_drives": wrong,
        "refusals": dict(Counter(str(c.get("reason", "")) for c in claims if c.get("outcome") == "refused")),
    }


def check_epsilon(
    devices: Mapping[str, float], shown: Mapping[str, float], *, tolerance: float = 1e-6
) -> dict[str, Any]:
    """The ε the console shows per device against the sum of that device's own ledger.

    Returns ``{devices, mismatches: {device: {device, shown}}}``; a device missing on either side is a mismatch.
    """
    mismatches = {}
    for dev in sorted(set(devices) | set(shown)):
        a, b = devices.get(dev), shown.get(dev)
        if a is None or b is None or abs(a - b) > tolerance * max(1.0, abs(a)):
            mismatches[dev] = {"device": a, "shown": b}
    return {"devices": len(set(devices) | set(shown)), "mismatches": mismatches}


def in_flight(released: Mapping[str, Sequence[float]], windows: Sequence[tuple[float, float]]) -> list[dict[str, int]]:
    """Per fault window, how many releases each device made while it lasted: what had to survive the fault.

    Parameters
    ----------
    released : mapping of str to sequence of float
        Device -> the times (its ledger's wall clock) of its releases.
    windows : sequence of (float, float)
        Each fault's start and the moment it had recovered (or ended, when it never did), same clock.

    Returns
    -------
    list of dict
        One ``{device: n}`` per window, devices with none left out.
    """
    out = []
    for lo, hi in windows:
        counts = {d: sum(1 for t in ts if lo <= t <= hi) for d, ts in released.items()}
        out.append({d: n for d, n in sorted(counts.items()) if n})
    return out
