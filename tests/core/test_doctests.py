"""The examples in peep.core's docstrings run and give what they say."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "peep.core.accounting", "peep.core.bounding", "peep.core.eigenface_model", "peep.core.features",
    "peep.core.mechanisms", "peep.core.sampling", "peep.core.statistics", "peep.core.release", "peep.core.wire",
    "peep.core.topics", "peep.core.logs", "peep.core.configfile", "peep.core.projections.fisherfaces",
    "peep.core.signing",
]  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_examples_exist():
    attempted = sum(doctest.testmod(importlib.import_module(n)).attempted for n in MODULES)
    assert attempted >= 10
