"""The audit measures the recogniser the server serves: the registry's preset, fitted by the server's code."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from peep.lab.audit.config import AuditConfig, AuditConfigError
from peep.server.config import TrainingConfig
from peep.server.recognition import fitting, presets


def test_the_default_preset_is_the_servers():
    assert AuditConfig().preset == presets.DEFAULT_PRESET == TrainingConfig().preset
    assert AuditConfig().recogniser_preset is presets.PRESETS[presets.DEFAULT_PRESET]
    cfg = AuditConfig(preset="reference", hidden=64)
    assert cfg.recogniser_preset == replace(presets.PRESETS["reference"], hidden_layer_sizes=(64,))


def test_preset_and_hidden_are_checked(monkeypatch):
    from sklearn.linear_model import LogisticRegression

    with pytest.raises(AuditConfigError, match=r"--preset: expected one of paper, default, reference"):
        AuditConfig(preset="nope")
    linear = presets.EstimatorPreset(name="linear-test", description="test", build=lambda s: LogisticRegression())
    monkeypatch.setitem(presets.PRESETS, "linear-test", linear)
    assert AuditConfig(preset="linear-test").recogniser_preset is linear
    with pytest.raises(AuditConfigError, match="--hidden: expected no value with a preset that is not an MLP"):
        AuditConfig(preset="linear-test", hidden=8)


@pytest.mark.slow
def test_utility_comes_from_the_servers_fit_recogniser(monkeypatch, audit_data, small_cfg):
    from peep.lab.audit import execution

    real = fitting.fit_recogniser
    calls: list[dict] = []

    def spy(X, subjects, **kwargs):
        fitted = real(X, subjects, **kwargs)
        calls.append({**kwargs, "fitted": fitted, "X": X})
        return fitted

    monkeypatch.setattr(fitting, "fit_recogniser", spy)
    cfg = small_cfg.with_(preset="reference", hidden=32)
    with execution.job_env(cfg):
        ctx, baseline = execution.make_context(audit_data, cfg, 0, n_components=16)
        private = execution.evaluate_release(ctx, cfg, kind="peep", epsilon=8.0, key=(9,), attacks=False)
    server = TrainingConfig()
    assert len(calls) == 2  # the no-privacy recogniser, then the one on perturbed templates
    for c in calls:
        assert c["preset"] == replace(presets.PRESETS["reference"], hidden_layer_sizes=(32,))
        assert c["background_prefix"] == ""
        assert c["validation_fraction"] == server.validation_fraction
        assert c["min_templates_per_subject"] == server.min_templates_per_subject
        assert c["target_far"] == server.target_far
    # the reported no-privacy accuracy is that fitted recogniser's, on the split's test templates
    clean = calls[0]["fitted"]
    np.testing.assert_array_equal(calls[0]["X"], ctx.C_train.astype(np.float32))
    P = clean.predict_proba(ctx.C_test.astype(np.float32))
    predicted = np.array([int(n) for n in clean.class_names])[P.argmax(axis=1)]
    assert baseline["accuracy"] == pytest.approx(float(np.mean(predicted == ctx.y_test)))
    assert 0.0 <= private["accuracy"] <= 1.0


@pytest.mark.slow
def test_audit_json_records_the_preset(tiny_audit):
    _, out, _ = tiny_audit
    doc = json.loads((out / "audit.json").read_text())
    protocol = doc["protocol"]
    assert protocol["preset"] == doc["config"]["preset"] == presets.DEFAULT_PRESET
    assert protocol["recogniser_parameters"]["name"] == presets.DEFAULT_PRESET
    assert protocol["recogniser_parameters"]["hidden_layer_sizes"] == [32]  # what ran: --hidden 32
    assert "--hidden" in protocol["recogniser"] and "fit_recogniser" in protocol["recogniser_training"]
    assert doc["config"]["hidden"] == 32
