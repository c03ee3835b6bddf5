"""Privacy accountant: refusal, per-key isolation and overrides, concurrency, persistence."""

from __future__ import annotations

import json
import math
import threading

import pytest
from peep.core.accounting import (
    InMemoryLedger,
    JsonlLedger,
    PrivacyAccountant,
    Spend,
    SpendLedger,
)
from peep.core.exceptions import BudgetError


def test_spend_within_budget_is_recorded():
    acc = PrivacyAccountant(epsilon_budget=10.0, clock=lambda: 123.0)
    entry = acc.spend("track:1", 4.0, note="peep")
    assert entry == Spend(key="track:1", epsilon=4.0, delta=0.0, time=123.0, note="peep")
    assert acc.spent("track:1") == (4.0, 0.0)
    assert acc.remaining("track:1") == (6.0, 0.0)
    assert acc.keys() == ["track:1"]


def test_refusal_names_everything_and_records_nothing():
    acc = PrivacyAccountant(epsilon_budget=10.0)
    acc.spend("track:1", 6.0)
    for call in (acc.check, acc.spend):
        with pytest.raises(BudgetError) as info:
            call("track:1", 5.0)
        message = str(info.value)
        for part in ("'track:1'", "budget ε=10", "spent ε=6", "requested ε=5"):
            assert part in message
    assert acc.spent("track:1") == (6.0, 0.0)
    assert len(acc.ledger.entries()) == 1
    assert isinstance(BudgetError("x"), ValueError)


def test_check_records_nothing():
    acc = PrivacyAccountant(epsilon_budget=1.0)
    acc.check("k", 1.0)
    assert acc.spent("k") == (0.0, 0.0)
    assert acc.keys() == []


def test_exact_budget_and_float_sums_fit():
    acc = PrivacyAccountant(epsilon_budget=1.0)
    for _ in range(10):
        acc.spend("k", 0.1)  # 10 × 0.1 must fit a budget of 1.0
    with pytest.raises(BudgetError):
        acc.spend("k", 1e-6)
    assert acc.spent("k")[0] == pytest.approx(1.0)


def test_delta_budget():
    acc = PrivacyAccountant(epsilon_budget=100.0)  # default δ budget 0: pure ε only
    acc.spend("k", 1.0)
    with pytest.raises(BudgetError, match="δ"):
        acc.spend("k", 1.0, 1e-6)
    acc = PrivacyAccountant(epsilon_budget=100.0, delta_budget=1e-5)
    for _ in range(10):
        acc.spend("k", 1.0, 1e-6)
    with pytest.raises(BudgetError):
        acc.spend("k", 1.0, 1e-6)
    assert acc.spent("k") == (10.0, pytest.approx(1e-5))


def test_per_key_isolation():
    acc = PrivacyAccountant(epsilon_budget=5.0)
    acc.spend("track:1", 5.0)
    acc.spend("track:2", 5.0)
    with pytest.raises(BudgetError):
        acc.spend("track:1", 0.5)
    assert acc.spent("track:2") == (5.0, 0.0)
    assert acc.remaining("subject:alice") == (5.0, 0.0)
    assert acc.keys() == ["track:1", "track:2"]


def test_per_key_budget_overrides():
    acc = PrivacyAccountant(epsilon_budget=2.0, budgets={"device:cam1": (100.0, 1e-6), "subject:bob": (0.0, 0.0)})
    assert acc.budget("device:cam1") == (100.0, 1e-6)
    assert acc.budget("track:9") == (2.0, 0.0)
    acc.spend("device:cam1", 50.0, 1e-7)
    with pytest.raises(BudgetError):
        acc.spend("track:9", 50.0)
    with pytest.raises(BudgetError):
        acc.spend("subject:bob", 1e-3)
    acc.spend("subject:bob", 0.0)  # a free release is allowed even with a zero budget


def test_unlimited_default():
    acc = PrivacyAccountant()
    acc.spend("k", 1e9)
    assert acc.remaining("k") == (math.inf, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"epsilon_budget": -1.0}, ValueError, "epsilon_budget"),
        ({"epsilon_budget": math.nan}, ValueError, "epsilon_budget"),
        ({"epsilon_budget": "10"}, TypeError, "epsilon_budget"),
        ({"delta_budget": 2.0}, ValueError, "delta_budget"),
        ({"budgets": {"k": (1.0,)}}, TypeError, "budgets"),
        ({"budgets": {"k": (-1.0, 0.0)}}, ValueError, "budgets"),
        ({"budgets": {"": (1.0, 0.0)}}, ValueError, "key"),
        ({"ledger": object()}, TypeError, "ledger"),
    ],
)
def test_constructor_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        PrivacyAccountant(**kwargs)


def test_spend_validation():
    acc = PrivacyAccountant(epsilon_budget=10.0)
    with pytest.raises(ValueError, match="epsilon"):
        acc.spend("k", -1.0)
    with pytest.raises(ValueError, match="epsilon"):
        acc.spend("k", math.nan)
    with pytest.raises(ValueError, match="delta"):
        acc.spend("k", 1.0, 1.5)
    with pytest.raises(TypeError, match="key"):
        acc.spend(42, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key"):
        acc.check("", 1.0)
    with pytest.raises(TypeError, match="note"):
        acc.spend("k", 1.0, note=3)  # type: ignore[arg-type]
    assert acc.keys() == []


def test_concurrent_spends_never_exceed_the_budget():
    budget, cost, threads, attempts = 100.0, 0.5, 16, 50
    acc = PrivacyAccountant(epsilon_budget=budget)
    granted = [0] * threads
    refused = [0] * threads
    barrier = threading.Barrier(threads)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(attempts):
            for key in ("shared", f"own:{i}"):
                try:
                    acc.spend(key, cost)
                    if key == "shared":
                        granted[i] += 1
                except BudgetError:
                    refused[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert sum(granted) == int(budget / cost)  # exactly the budget, never more
    assert acc.spent("shared")[0] == budget
    assert sum(refused) == threads * attempts - int(budget / cost)
    for i in range(threads):
        assert acc.spent(f"own:{i}") == (attempts * cost, 0.0)  # isolated keys unaffected
    assert len(acc.ledger.entries("shared")) == 200


def test_listener_called_and_unsubscribed():
    acc = PrivacyAccountant(epsilon_budget=3.0)
    seen: list[Spend] = []
    unsubscribe = acc.on_spend(seen.append)
    acc.spend("k", 1.0, note="a")
    with pytest.raises(BudgetError):
        acc.spend("k", 5.0)  # refused: listener not called
    assert [s.note for s in seen] == ["a"]
    unsubscribe()
    acc.spend("k", 1.0)
    assert len(seen) == 1
    with pytest.raises(TypeError, match="callback"):
        acc.on_spend(42)  # type: ignore[arg-type]


def test_failing_listener_does_not_undo_the_spend(caplog):
    acc = PrivacyAccountant(epsilon_budget=3.0)

    def broken(spend: Spend) -> None:
        raise RuntimeError("metrics down")

    acc.on_spend(broken)
    acc.spend("k", 1.0)
    assert acc.spent("k") == (1.0, 0.0)
    assert "listener" in caplog.text


def test_in_memory_ledger_protocol_and_totals():
    ledger = InMemoryLedger()
    assert isinstance(ledger, SpendLedger)
    for _ in range(1000):
        ledger.append(Spend(key="k", epsilon=0.1, delta=1e-9, time=0.0))
    eps, delta = ledger.totals("k")
    assert eps == 100.0  # exact sum rounded once (naive float summation gives 99.9999999999986)
    assert delta == pytest.approx(1e-6, rel=1e-12)
    assert ledger.totals("none") == (0.0, 0.0)
    assert len(ledger.entries("k")) == 1000 and ledger.entries("x") == []
    with pytest.raises(TypeError, match="spend"):
        ledger.append(("k", 1.0))  # type: ignore[arg-type]


def test_jsonl_ledger_survives_reopen(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with JsonlLedger(path) as ledger:
        assert isinstance(ledger, SpendLedger)
        acc = PrivacyAccountant(epsilon_budget=10.0, ledger=ledger, clock=lambda: 5.0)
        acc.spend("track:1", 4.0, note="first")
        acc.spend("subject:alice", 1.5, 0.0, note="ünïcode")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["key"] == "track:1"

    reopened = JsonlLedger(path)
    acc2 = PrivacyAccountant(epsilon_budget=10.0, ledger=reopened)
    assert acc2.spent("track:1") == (4.0, 0.0)
    assert acc2.keys() == ["track:1", "subject:alice"]
    assert reopened.entries("subject:alice")[0].note == "ünïcode"
    with pytest.raises(BudgetError):
        acc2.spend("track:1", 6.5)
    acc2.spend("track:1", 6.0)
    reopened.close()
    with pytest.raises(ValueError, match="closed"):
        reopened.append(Spend(key="k", epsilon=1.0, delta=0.0, time=0.0))
    assert JsonlLedger(path).totals("track:1") == (10.0, 0.0)


def test_jsonl_ledger_refuses_corrupt_files(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with JsonlLedger(path) as ledger:
        ledger.append(Spend(key="k", epsilon=1.0, delta=0.0, time=0.0))
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"key": "k", "epsilon": 2')  # torn write (crash mid-line)
    with pytest.raises(ValueError, match=r"line 2"):
        JsonlLedger(path)
    path.write_text('{"key": "k"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"ledger.jsonl: line 1"):
        JsonlLedger(path)


def test_spends_carry_typed_per_coordinate_epsilon_purpose_and_message_id(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with JsonlLedger(path) as ledger:
        acc = PrivacyAccountant(epsilon_budget=100.0, ledger=ledger)
        s = acc.spend("track:1", 16.0, epsilon_coordinate=0.125, purpose="identify", message_id="m-1")
    assert (s.epsilon_vector, s.epsilon_coordinate, s.purpose, s.message_id, s.note) == (
        16.0,
        0.125,
        "identify",
        "m-1",
        "",
    )
    (again,) = JsonlLedger(path).entries()
    assert again == s
    with pytest.raises(ValueError, match="epsilon_coordinate"):
        acc.spend("track:1", 1.0, epsilon_coordinate=-1.0)


def test_release_cost_is_the_template_plus_its_soft_traits():
    from peep.core.accounting import ReleaseCost
    from peep.core.mechanisms import PeepMechanism

    cost = ReleaseCost.of(PeepMechanism(epsilon=8.0, n_components=128), soft_epsilon=2.0)
    assert (cost.epsilon_vector, cost.epsilon_coordinate, cost.delta) == (1024.0, 8.0, 0.0)
    assert cost.total_vector == 1026.0
    assert cost.releases_within(2052.0) == 2 and cost.releases_within(2051.0) == 1
