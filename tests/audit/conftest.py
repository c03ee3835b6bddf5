"""Fixtures for the audit tests: small configurations on the staged LFW faces.

Everything is sized to keep tests/audit under about three minutes on two
cores: few eigenfaces, a small MLP, one or two splits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def small_cfg(data_home: str):
    from peep.lab.audit.config import AuditConfig

    return AuditConfig(
        data_home=data_home,
        components=32,
        hidden=64,
        repeats=1,
        jobs=1,
        progress=False,
        epsilons=(1.0, 8.0),
        sweep_components=(),
        sweep_images=(),
    )


@pytest.fixture(scope="session")
def audit_data(small_cfg):
    from peep.lab.audit.execution import load_audit_data

    return load_audit_data(small_cfg)


@pytest.fixture(scope="session")
def small_ctx(audit_data, small_cfg):
    """One split, nc = 32, with the clean recogniser and the baselines."""
    from peep.lab.audit.execution import job_env, make_context

    with job_env(small_cfg):
        ctx, baseline = make_context(audit_data, small_cfg, 0, n_components=small_cfg.components)
    return ctx, baseline


@pytest.fixture(scope="session")
def tiny_audit(tmp_path_factory: pytest.TempPathFactory, small_cfg):
    """A complete (tiny) audit written to disk: two ε, two splits, sweeps, nc = 16."""
    from peep.lab.audit.run import run_audit

    cfg = small_cfg.with_(
        components=16,
        hidden=32,
        repeats=2,
        epsilons=(2.0, 16.0),
        sweep_components=(8, 16),
        sweep_images=(10,),
    )
    result = run_audit(cfg, command=["peep", "audit", "(test)"])
    out = tmp_path_factory.mktemp("tiny-audit")
    report = result.write(out)
    return result, Path(out), report


@pytest.fixture
def seeded():
    from peep.core import features

    with features.enabled("seeded-noise"):
        yield np.random.default_rng(2024)
