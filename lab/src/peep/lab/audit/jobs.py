"""The jobs of the audit's main section, run in worker processes, and the tags that keep their noise apart.

:func:`peep.lab.audit.execution.run_jobs` runs each job as ``fn(*args)`` in a
worker process (loky, through joblib), so every job here is a module-level
function: the worker unpickles it by its qualified name. Each returns its
result and the CPU seconds it took, and runs inside
:func:`~peep.lab.audit.execution.job_env` (BLAS pinned to one thread, seeded
noise when simulating):

- :func:`prepare_job`: one split's context and clean baseline
  (:func:`~peep.lab.audit.execution.make_context`);
- :func:`evaluate_job`: utility and every attack at one ε
  (:func:`~peep.lab.audit.execution.evaluate_release`);
- :func:`sweep_job`: one point of the utility-vs-components or
  utility-vs-images curve (:func:`sweep_point`);
- :func:`frontier_group_job`: the frontier's selection for one projection,
  nc and bounds (:func:`frontier_group`).

The bystander, open-set and site-key sections keep their jobs beside what
they measure (:mod:`peep.lab.audit.bystander`, :mod:`peep.lab.audit.open_set`,
:mod:`peep.lab.audit.protection`); the bystander jobs' tag is here with the
main section's, as one line of distinct numbers, while the open-set and
site-key sections seed their streams from tags of their own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from peep.core.domains import domain
from peep.core.mechanisms import mechanism_class
from peep.core.projections import projection_kinds
from peep.lab.audit.config import FRONTIER_MECHANISMS, AuditConfig
from peep.lab.audit.execution import (
    AuditData,
    RepeatContext,
    basis_faces,
    evaluate_release,
    fit_served,
    fit_split_basis,
    job_env,
    make_context,
    proba_full,
)
from peep.lab.audit.measures import classification_metrics

# Job tags keep the noise streams of different job families apart.
TAG_EVAL, TAG_SWEEP, TAG_FRONTIER_SELECT, TAG_FRONTIER_EVAL, TAG_BYSTANDER = 1, 2, 3, 4, 5
# Split indices of the frontier's selection split and its fresh evaluation splits.
FRONTIER_SELECT_SPLIT = 10_000
FRONTIER_EVAL_SPLIT = 20_000


# --------------------------------------------------------------------------- splits and evaluations


def prepare_job(
    data: AuditData,
    cfg: AuditConfig,
    split: int,
    n_components: int,
    variant: str,
    with_clean: bool,
    projection: str | None = None,
) -> tuple[tuple[RepeatContext, dict[str, Any]], float]:
    """Split ``split``'s context and clean baseline (:func:`~peep.lab.audit.execution.make_context`).

    Returns
    -------
    prepared : tuple of (RepeatContext, dict)
        The context every ε of the split shares, and its no-privacy baseline (empty without ``with_clean``).
    cpu : float
        CPU seconds the job took.
    """
    t = time.process_time()
    with job_env(cfg):
        ctx, base = make_context(
            data,
            cfg,
            split,
            n_components=n_components,
            variant=variant,
            with_clean=with_clean,
            projection=projection,
        )
    return (ctx, base), time.process_time() - t


def evaluate_job(ctx: RepeatContext, cfg: AuditConfig, kwargs: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """:func:`~peep.lab.audit.execution.evaluate_release` on ``ctx`` with keyword arguments ``kwargs``.

    Returns
    -------
    result : dict
        Utility and (unless ``kwargs`` turns them off) every attack at one ε.
    cpu : float
        CPU seconds the job took.
    """
    t = time.process_time()
    with job_env(cfg):
        res = evaluate_release(ctx, cfg, **kwargs)
    return res, time.process_time() - t


# --------------------------------------------------------------------------- sweeps


def sweep_point(
    data: AuditData, ctx: RepeatContext, cfg: AuditConfig, sweep: str, value: int, key: Sequence[int]
) -> dict[str, Any] | None:
    """Clean and private (at the sweep ε) utility for one nc or images-per-subject value."""
    eps = cfg.effective_sweep_epsilon
    if sweep == "components":
        fit_on, _, _ = basis_faces(data, ctx.train_idx, ctx.basis.input_kind)
        limit = fit_on.shape[0] - 1
        if value > limit:
            return None
        basis = fit_split_basis(data, cfg, ctx.train_idx, value, ctx.basis.kind)
        if basis.n_components != value:
            return None  # capped by the basis (e.g. Fisherfaces: at most identities − 1)
        sub = RepeatContext(
            split=ctx.split,
            seed=ctx.seed,
            basis=basis,
            y_train=ctx.y_train,
            y_test=ctx.y_test,
            C_train=basis.transform(data.inputs(basis.input_kind)[ctx.train_idx]),
            C_test=basis.transform(data.inputs(basis.input_kind)[ctx.test_idx]),
            test_images=ctx.test_images,
            n_classes=ctx.n_classes,
            train_idx=ctx.train_idx,
            test_idx=ctx.test_idx,
        )
    else:
        keep = np.concatenate([np.flatnonzero(ctx.y_train == c)[:value] for c in range(ctx.n_classes)])
        keep.sort()
        sub = RepeatContext(
            split=ctx.split,
            seed=ctx.seed,
            basis=ctx.basis,
            y_train=ctx.y_train[keep],
            y_test=ctx.y_test,
            C_train=ctx.C_train[keep],
            C_test=ctx.C_test,
            test_images=ctx.test_images,
            n_classes=ctx.n_classes,
            train_idx=ctx.train_idx[keep],
            test_idx=ctx.test_idx,
        )
    clean = fit_served(cfg, sub.C_train, sub.y_train, ctx.seed)
    clean_m = classification_metrics(sub.y_test, proba_full(clean, sub.C_test, sub.n_classes).argmax(axis=1))
    private = evaluate_release(sub, cfg, kind=cfg.mechanism, epsilon=eps, key=key, attacks=False)
    per_subject = np.bincount(sub.y_train, minlength=sub.n_classes)
    return {
        "value": value,
        "n_components": sub.basis.n_components,
        "images_per_subject_min": int(per_subject.min()),
        "images_per_subject_mean": float(per_subject.mean()),
        "epsilon": private["epsilon"],
        "epsilon_coordinate": private["epsilon_coordinate"],
        "epsilon_vector": private["epsilon_vector"],
        "no_privacy": {k: clean_m[k] for k in ("accuracy", "weighted_f1", "balanced_accuracy")},
        "private": {k: private[k] for k in ("accuracy", "weighted_f1", "balanced_accuracy")},
    }


def sweep_job(
    data: AuditData, ctx: RepeatContext, cfg: AuditConfig, sweep: str, value: int, key: Sequence[int]
) -> tuple[dict[str, Any] | None, float]:
    """:func:`sweep_point` as a job.

    Returns
    -------
    point : dict or None
        The sweep point, or None where the basis cannot reach ``value``.
    cpu : float
        CPU seconds the job took.
    """
    t = time.process_time()
    with job_env(cfg):
        res = sweep_point(data, ctx, cfg, sweep, value, key)
    return res, time.process_time() - t


# --------------------------------------------------------------------------- frontier selection


def frontier_group(
    data: AuditData, cfg: AuditConfig, n_components: int, variant: str, projection: str = "eigenfaces"
) -> list[dict[str, Any]]:
    """Utility of every mechanism × per-vector ε for one (projection, nc, bounds) on the selection split."""
    ctx, _ = make_context(
        data,
        cfg,
        FRONTIER_SELECT_SPLIT,
        n_components=n_components,
        variant=variant,
        with_clean=False,
        projection=projection,
    )
    p_index = projection_kinds().index(projection)
    rows: list[dict[str, Any]] = []
    for i, target in enumerate(cfg.frontier_epsilons):
        for j, kind in enumerate(FRONTIER_MECHANISMS):
            cls = mechanism_class(kind)
            if target > cls.max_epsilon:
                continue  # outside the kind's range (e.g. privunit above 500): not a candidate there
            if variant != "bundle" and not domain(cls.domain).uses_bounds:
                continue  # the unit sphere needs no bounds: 'tight' would repeat 'bundle'
            res = evaluate_release(
                ctx,
                cfg,
                kind=kind,
                target_vector=target,
                key=(TAG_FRONTIER_SELECT, p_index, n_components, BOUNDS_INDEX[variant], i, j),
                attacks=False,
            )
            rows.append(
                {
                    "target_epsilon_vector": target,
                    "projection": projection,
                    "mechanism": kind,
                    "n_components": ctx.basis.n_components,
                    "bounds": variant,
                    "epsilon": res["epsilon"],
                    "epsilon_coordinate": res["epsilon_coordinate"],
                    "epsilon_vector": res["epsilon_vector"],
                    "accuracy": res["accuracy"],
                    "weighted_f1": res["weighted_f1"],
                    "balanced_accuracy": res["balanced_accuracy"],
                }
            )
    return rows


BOUNDS_INDEX = {"bundle": 0, "tight": 1}


def frontier_group_job(
    data: AuditData, cfg: AuditConfig, n_components: int, variant: str, projection: str = "eigenfaces"
) -> tuple[list[dict[str, Any]], float]:
    """:func:`frontier_group` as a job.

    Returns
    -------
    rows : list of dict
        Utility of every mechanism × per-vector ε the group reaches.
    cpu : float
        CPU seconds the job took.
    """
    t = time.process_time()
    with job_env(cfg):
        res = frontier_group(data, cfg, n_components, variant, projection)
    return res, time.process_time() - t
