"""Image and classification metrics, vectorised over batches."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.ndimage import uniform_filter

FloatArray = NDArray[np.float64]


def ssim_batch(a: ArrayLike, b: ArrayLike, *, data_range: float = 1.0, win_size: int = 7) -> FloatArray:
    """Mean SSIM of each image pair, as ``skimage.metrics.structural_similarity``.

    Same definition as scikit-image's defaults (7×7 uniform window, sample
    covariance, K1 = 0.01, K2 = 0.03, mean over the map without a border of
    ``(win_size − 1)/2``), computed for a whole batch at once.

    Parameters
    ----------
    a, b : array-like of shape (n_images, height, width)
    data_range : float, default 1.0

    Returns
    -------
    ndarray of shape (n_images,)
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 3:
        raise ValueError(f"a, b: expected equal shapes (n, height, width), received {x.shape} and {y.shape}")
    size = (1, win_size, win_size)
    n_pix = win_size * win_size
    cov_norm = n_pix / (n_pix - 1.0)
    ux = uniform_filter(x, size=size)
    uy = uniform_filter(y, size=size)
    uxx = uniform_filter(x * x, size=size)
    uyy = uniform_filter(y * y, size=size)
    uxy = uniform_filter(x * y, size=size)
    vx = cov_norm * (uxx - ux * ux)
    vy = cov_norm * (uyy - uy * uy)
    vxy = cov_norm * (uxy - ux * uy)
    c1 = (0.01 * data_range) ** 2
    c2 = (0.03 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    pad = (win_size - 1) // 2
    inner = s[:, pad : s.shape[1] - pad, pad : s.shape[2] - pad]
    out: FloatArray = inner.mean(axis=(1, 2))
    return out


def psnr_batch(a: ArrayLike, b: ArrayLike, *, data_range: float = 1.0) -> FloatArray:
    """PSNR in dB of each image pair, shape (n_images,) (capped at 100 dB for identical images)."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    mse = ((x - y) ** 2).reshape(x.shape[0], -1).mean(axis=1)
    with np.errstate(divide="ignore"):
        out: FloatArray = np.minimum(10.0 * np.log10(data_range**2 / mse), 100.0)
    return out


def classification_metrics(y_true: ArrayLike, y_pred: ArrayLike) -> dict[str, float]:
    """Accuracy, balanced accuracy and weighted precision/recall/F1 (zero for empty classes)."""
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, precision_recall_fscore_support

    yt = np.asarray(y_true)
    yp = np.asarray(y_pred)
    p, r, f, _ = precision_recall_fscore_support(yt, yp, average="weighted", zero_division=0)
    return {
        "accuracy": float(accuracy_score(yt, yp)),
        "balanced_accuracy": float(balanced_accuracy_score(yt, yp)),
        "weighted_precision": float(p),
        "weighted_recall": float(r),
        "weighted_f1": float(f),
    }


def majority_rate(y: ArrayLike) -> float:
    """Accuracy of always guessing the most frequent label of ``y``."""
    arr = np.asarray(y)
    if arr.size == 0:
        return float("nan")
    return float(np.bincount(arr).max() / arr.size)


def membership_auc(member_scores: ArrayLike, nonmember_scores: ArrayLike) -> float:
    """ROC AUC of a threshold on ``score`` deciding member (higher) vs non-member."""
    from sklearn.metrics import roc_auc_score

    m = np.asarray(member_scores, dtype=np.float64)
    n = np.asarray(nonmember_scores, dtype=np.float64)
    labels = np.concatenate([np.ones(m.size), np.zeros(n.size)])
    return float(roc_auc_score(labels, np.concatenate([m, n])))


def identity_mixture(proba: ArrayLike, y_true: ArrayLike, prior: ArrayLike) -> dict[str, object]:
    """Identity-mixture metrics of an adversary's posteriors (Moriarty et al.).

    Parameters
    ----------
    proba : array-like of shape (n_probes, n_classes)
        The adversary's posterior over identities for each release.
    y_true : array-like of shape (n_probes,)
    prior : array-like of shape (n_classes,)
        Class frequencies the adversary knows (its best guess without a release).

    Returns
    -------
    dict
        ``mixture``: mean posterior mass on the true identity (vs
        ``random_guess`` = 1/K); ``top_k``: fraction of releases whose true
        identity is among the adversary's k most likely (vs ``top_k_random``
        = k/K and ``top_k_prior`` = mass of the k most frequent identities);
        ``kl_from_random``: mean KL(posterior ‖ uniform) in nats;
        ``kl_from_prior``: mean KL(posterior ‖ class frequencies).
    """
    P = np.clip(np.asarray(proba, dtype=np.float64), 1e-300, None)
    P = P / P.sum(axis=1, keepdims=True)
    y = np.asarray(y_true)
    pri = np.asarray(prior, dtype=np.float64)
    pri = pri / pri.sum()
    n, k_all = P.shape
    order = np.argsort(-P, axis=1)
    rank = np.argmax(order == y[:, None], axis=1)  # 0 = most likely
    ks = [k for k in (1, 2, 3, 5) if k < k_all] or [1]
    sorted_prior = np.sort(pri)[::-1]
    logp = np.log(P)
    return {
        "mixture": float(P[np.arange(n), y].mean()),
        "random_guess": 1.0 / k_all,
        "top_k": {str(k): float((rank < k).mean()) for k in ks},
        "top_k_random": {str(k): k / k_all for k in ks},
        "top_k_prior": {str(k): float(sorted_prior[:k].sum()) for k in ks},
        "kl_from_random": float((P * (logp + np.log(k_all))).sum(axis=1).mean()),
        "kl_from_prior": float((P * (logp - np.log(np.clip(pri, 1e-300, None)))).sum(axis=1).mean()),
    }
