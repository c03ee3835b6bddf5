"""Fixtures for the soft-biometric query module (QBBS) tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from peep.core import features


@pytest.fixture
def seeded() -> Iterator[None]:
    """Enable the unsafe 'seeded-noise' feature for one test (simulation only)."""
    with features.enabled("seeded-noise"):
        yield


PEOPLE: dict[str, dict[str, float]] = {
    "alice": {"age": 34.0, "gender": 0.0, "height": 168.0, "weight": 61.0},
    "bob": {"age": 52.0, "gender": 1.0, "height": 181.5, "weight": 92.0},
    "carol": {"age": 27.0, "gender": 0.0, "height": 159.0, "weight": 55.5},
    "dave": {"age": 45.0, "gender": 1.0, "height": 175.0, "weight": 80.0},
    "erin": {"age": 63.0, "gender": 0.0, "height": 162.0, "weight": 70.0},
}


@pytest.fixture
def people() -> dict[str, dict[str, float]]:
    return {k: dict(v) for k, v in PEOPLE.items()}


@pytest.fixture
def make_module(tmp_path) -> Iterator[Callable[..., Any]]:
    """Build a QbbsModule with config overrides; closes them at teardown."""
    from peep.server.qbbs import QbbsConfig, QbbsModule

    made: list[Any] = []

    def make(
        *,
        enrol: bool = True,
        persist: bool = False,
        random_state: object = None,
        face_scores: Any = None,
        **overrides: Any,
    ) -> Any:
        data: dict[str, Any] = dict(overrides)
        if persist:
            data.setdefault("store_path", tmp_path / "qbbs.sqlite")
            data.setdefault("ledger_path", tmp_path / "qbbs-ledger.jsonl")
        module = QbbsModule(QbbsConfig.model_validate(data), random_state=random_state, face_scores=face_scores)
        made.append(module)
        if enrol:
            for name, traits in PEOPLE.items():
                module.enrol(name, traits)
        return module

    yield make
    for m in made:
        m.close()
