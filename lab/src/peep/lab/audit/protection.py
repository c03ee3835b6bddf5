"""Template protection with site keys, measured by ISO/IEC 24745's properties and attacks on the key.

``peep audit --site-keys N`` simulates N sites, each with its own key (:mod:`peep.core.sitekey`), on the
same splits and seeds as the rest of the audit, and reports per ε (``template_protection`` in audit.json):

performance
    Accuracy of the served recogniser trained and tested on keyed releases (``mechanism(Q z)``) next to
    unkeyed ones. For rotation-equivariant mechanisms a keyed release has the law of ``Q`` times an
    unkeyed one, and a recogniser that only sees rotated data learns the rotated problem: what differs
    is the noise draw and the recogniser's own (in)variance to rotations, so the difference should sit
    within the run-to-run spread.
unlinkability
    Gomez-Barrero et al. (IEEE TIFS 2018): from the cosine scores of mated pairs (one person's templates
    at two sites) and non-mated pairs (two people's), the local measure
    ``D(s) = max(0, 2 LR(s) / (1 + LR(s)) - 1)`` with ``LR(s) = p(s | mated) / p(s | non-mated)`` (ω = 1),
    and the global ``D_sys = ∫ p(s | mated) D(s) ds`` in [0, 1] (0: the scores say nothing about whether two
    templates are the same person's). Reported between two sites with different keys and between two
    sites sharing one (today's unkeyed deployments are the latter).
renewability
    A model trained under a new key (site B's) is shown captures released under the old one (site A's):
    its accuracy on them, next to its accuracy on the new key's captures and chance.
irreversibility
    The retrieval reconstruction the audit runs elsewhere (the nearest public face's input, re-identified
    by a clean recogniser) by a thief who holds the stored templates and the public bundle: without the
    key (he treats the keyed releases as unkeyed), and with it (``Q^T`` applied first: what today's
    unkeyed database gives away).
attacks on the key
    (a) *insider Procrustes*: someone who has photos of k enrolled people computes their clean public
    templates, pairs them with the same photos' stored releases and estimates ``Q`` by orthogonal
    Procrustes; then re-identifies everyone else. (b) *public background*: the background population
    came from a public dataset; the thief registers the stored background groups to the public people
    (group sizes constrain the assignment; assignment and Procrustes on group means, iterated from
    several starts) and estimates ``Q``. (c) *distribution only*: no pairs; the releases' covariance and
    third moments against the public faces' (eigenvectors matched in order, signs by skewness).
    Each reports the re-identification its estimate of ``Q`` buys, next to the key-holder's and chance.

Keys here are simulation keys drawn from the audit's seed (reproducible runs); devices draw theirs from
the OS CSPRNG (``peep-edge site-key generate``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.core.sitekey import KEY_BYTES, SiteKey
from peep.lab.audit.basis import Basis, Domain
from peep.lab.audit.config import AuditConfig

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]

#: Known people for the insider attack (as many as leave at least one other person to re-identify).
INSIDER_PEOPLE = (1, 2, 4, 8, 16, 32, 64)
#: Known photos of one person, the insider attack's other axis (its cost is pairs, not people).
INSIDER_PHOTOS = (1, 2, 4, 8, 16, 32, 64)
#: Tag of this section's noise streams and simulation keys (24745: ISO/IEC 24745), apart from other job families'.
TAG_PROTECTION = 24745


def simulation_keys(cfg: AuditConfig, n: int, split: int = 0) -> list[SiteKey]:
    """``n`` site keys for one split, drawn from the audit's seed (a simulation: reproducible, never a device's key).

    Each split has its own keys, so the means over splits are over key draws too (one relative rotation
    between two keys can favour a few identities by luck).
    """
    keys = []
    for i in range(n):
        seq = np.random.SeedSequence([cfg.seed, TAG_PROTECTION, split, i])
        state = seq.generate_state(KEY_BYTES // 4, dtype=np.uint32)
        keys.append(SiteKey(state.astype("<u4").tobytes()))
    return keys


def dsys(mated: FloatArray, nonmated: FloatArray, bins: int = 100) -> float:
    """Global unlinkability D↔sys of Gomez-Barrero et al. (2018) from two score samples (ω = 1).

    Densities are histograms on common bins over the pooled range; bins where the non-mated density is
    zero and the mated one is not count as fully linkable (D = 1).
    """
    mated, nonmated = np.asarray(mated, dtype=np.float64), np.asarray(nonmated, dtype=np.float64)
    lo, hi = float(min(mated.min(), nonmated.min())), float(max(mated.max(), nonmated.max()))
    edges = np.linspace(lo, hi + 1e-12, bins + 1)
    pm = np.histogram(mated, edges)[0] / mated.size
    pn = np.histogram(nonmated, edges)[0] / nonmated.size
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.where(pn > 0, pm / np.where(pn > 0, pn, 1.0), np.inf)
        d = np.where(np.isinf(lr), 1.0, np.maximum(0.0, 2.0 * lr / (1.0 + lr) - 1.0))
    return float(np.sum(pm * d))


def procrustes(clean: FloatArray, released: FloatArray) -> FloatArray:
    """The orthogonal ``Q`` minimising ``‖clean Qᵀ − released‖_F`` (rows are vectors), shape (K, K)."""
    u, _, vt = np.linalg.svd(np.asarray(released, dtype=np.float64).T @ np.asarray(clean, dtype=np.float64))
    out: FloatArray = u @ vt
    return out


def _unit(x: FloatArray) -> FloatArray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def _cosines(a: FloatArray, b: FloatArray) -> FloatArray:
    return _unit(a) @ _unit(b).T


@dataclass
class _Site:
    """One site's stored templates of the audited people: train (enrolment) and test (later captures)."""

    train: FloatArray
    test: FloatArray


def _scores(site_a: FloatArray, ya: IntArray, site_b: FloatArray, yb: IntArray) -> tuple[FloatArray, FloatArray]:
    s = _cosines(site_a, site_b)
    same = ya[:, None] == yb[None, :]
    return s[same], s[~same]


def _reid(basis: Basis, domain: Domain, clean_mlp: Any, releases: FloatArray, y: IntArray) -> float:
    """Re-identification by retrieval (and shrinkage-free direct inversion): the audit's reconstruction reid."""
    from peep.lab.audit.attacks import reconstruct_direct

    faces, inputs = reconstruct_direct(releases, domain, basis)
    pred = clean_mlp.predict(basis.transform(faces if inputs is None else inputs))
    return float((np.asarray(pred) == y).mean())


def _background_attack(
    stored: FloatArray, stored_groups: IntArray, public: FloatArray, public_groups: IntArray, rng: np.random.Generator,
    restarts: int = 24, iterations: int = 12,
) -> tuple[FloatArray, float]:  # fmt: skip
    """Estimate ``Q`` by registering stored background groups to public people (sizes, then means).

    Returns the estimate and the share of groups assigned to their true public person (the thief does
    not know it; reported to explain the outcome).
    """
    from scipy.optimize import linear_sum_assignment

    g_ids, p_ids = np.unique(stored_groups), np.unique(public_groups)
    g_mean = _unit(np.stack([stored[stored_groups == g].mean(axis=0) for g in g_ids]))
    p_mean = _unit(np.stack([public[public_groups == p].mean(axis=0) for p in p_ids]))
    g_size = np.array([np.sum(stored_groups == g) for g in g_ids])
    p_size = np.array([np.sum(public_groups == p) for p in p_ids])
    # A group can only be a public person with as many photos: other pairs are forbidden.
    forbidden = g_size[:, None] != p_size[None, :]
    k = stored.shape[1]
    best_q, best_cost, best_match = np.eye(k), np.inf, np.zeros(0, dtype=np.intp)
    for _ in range(restarts):
        q = np.linalg.qr(rng.standard_normal((k, k)))[0]  # a random start: the thief knows nothing of Q
        for _ in range(iterations):
            cost = -(g_mean @ q) @ p_mean.T  # cosine of the un-rotated group mean with each public mean
            cost = np.where(forbidden, 1e6, cost)
            rows, cols = linear_sum_assignment(cost)
            ok = cost[rows, cols] < 1e5
            if ok.sum() < 2:
                break
            q_new = procrustes(p_mean[cols[ok]], g_mean[rows[ok]])
            if np.allclose(q_new, q):
                break
            q = q_new
        cost = -(g_mean @ q) @ p_mean.T
        cost = np.where(forbidden, 1e6, cost)
        rows, cols = linear_sum_assignment(cost)
        total = float(cost[rows, cols].sum())
        if total < best_cost:
            best_q, best_cost, best_match = q, total, cols
    truth = {g: i for i, g in enumerate(p_ids)}
    right = np.mean([best_match[i] == truth.get(g, -1) for i, g in enumerate(g_ids)]) if best_match.size else 0.0
    return best_q, float(right)


def _distribution_attack(released: FloatArray, public: FloatArray) -> FloatArray:
    """Estimate ``Q`` from moments alone: covariance eigenvectors matched in order, signs by third moments."""

    def frame(x: FloatArray) -> FloatArray:
        xc = x - x.mean(axis=0)
        w, v = np.linalg.eigh(np.cov(xc.T))
        v = v[:, np.argsort(w)[::-1]]
        skew = np.mean((xc @ v) ** 3, axis=0)
        return v * np.where(skew < 0, -1.0, 1.0)

    # released ≈ public Qᵀ, so cov(released) = Q cov(public) Qᵀ: its eigenvectors are Q's images of the public ones.
    vr, vp = frame(released), frame(public)
    out: FloatArray = vr @ vp.T
    return out


def evaluate_protection(
    ctx: Any, cfg: AuditConfig, data: Any, *, kind: str, epsilon: float, key: tuple[int, ...]
) -> dict[str, Any]:
    """Every property and attack of the section for one split and one ε (module docstring)."""
    from peep.lab.audit.execution import audited_mechanism, fit_served, noise_state, proba_full

    t0 = time.process_time()
    basis: Basis = ctx.basis
    dom = Domain(kind, basis.bounds)
    keys = simulation_keys(cfg, max(2, cfg.site_keys), ctx.split)
    rng_noise = noise_state(cfg, (*key, 0))
    mech = audited_mechanism(cfg, basis, kind, epsilon, rng_noise)
    Ztr, Zte = dom.forward(ctx.C_train), dom.forward(ctx.C_test)
    k_dim = Ztr.shape[1]
    ytr, yte = ctx.y_train, ctx.y_test
    K = ctx.n_classes

    def release(z: FloatArray, site_key: SiteKey | None) -> FloatArray:
        x = z if site_key is None else site_key.apply(z)
        return np.asarray(mech.release(x), dtype=np.float64)

    rng_split = np.random.default_rng(np.random.SeedSequence([cfg.seed, TAG_PROTECTION, *key, 1]))
    # Performance: the same splits, unkeyed and under site 0's key.
    plain = _Site(release(Ztr, None), release(Zte, None))
    sites = [_Site(release(Ztr, k), release(Zte, k)) for k in keys]
    acc: dict[str, float] = {}
    for name, site in (("unkeyed", plain), ("keyed", sites[0]), ("renewed", sites[1])):
        mlp = fit_served(cfg, site.train, ytr, ctx.seed)
        acc[name] = float((proba_full(mlp, site.test, K).argmax(axis=1) == yte).mean())
        if name == "renewed":
            # Renewal: a model trained under the new key, shown captures released under the old one.
            acc["old_key_under_new_model"] = float((proba_full(mlp, sites[0].test, K).argmax(axis=1) == yte).mean())

    # Unlinkability: people at two sites, each person's photos split in two (one half captured at site A, the
    # other at site B: two deployments never hold the same capture); mated = one person across the sites.
    # Cross-key: B has its own key; same-key: B shares A's (every deployment without keys is this case). On the
    # background population when there is one: D_sys compares score distributions, and with a handful of
    # identities (LFW-5) the mated scores are a mixture of five values whatever the key.
    bg_inputs = data.background_descriptors.get(basis.input_kind) if basis.input_kind != "pixels" else data.background
    has_bg = bg_inputs is not None and data.background_labels is not None and len(bg_inputs) > 0
    if has_bg:
        Zbg = dom.forward(basis.transform(np.asarray(bg_inputs)))
        Zu, yu = Zbg, np.asarray(data.background_labels)
    else:
        Zu, yu = Zte, yte
    half = np.zeros(yu.size, dtype=bool)
    for c in np.unique(yu):
        idx = np.flatnonzero(yu == c)
        half[rng_split.permutation(idx)[: idx.size // 2]] = True
    a, b = half, ~half
    site_a = release(Zu[a], keys[0])
    m_cross, n_cross = _scores(site_a, yu[a], release(Zu[b], keys[1]), yu[b])
    m_same, n_same = _scores(site_a, yu[a], release(Zu[b], keys[0]), yu[b])
    unlinkability_people = int(np.unique(yu).size)
    d_cross, d_same = dsys(m_cross, n_cross), dsys(m_same, n_same)

    # Irreversibility: retrieval re-identification without the key and with it.
    q0 = keys[0].rotation(k_dim)
    reid_without = _reid(basis, dom, ctx.clean_mlp, sites[0].test, yte)
    reid_with = _reid(basis, dom, ctx.clean_mlp, sites[0].test @ q0, yte)
    reid_unkeyed = _reid(basis, dom, ctx.clean_mlp, plain.test, yte)
    chance = float(np.bincount(yte, minlength=K).max() / yte.size)

    # (a) insider: k known people (all their training photos), or m photos of one person.
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, TAG_PROTECTION, *key]))
    people = np.unique(ytr)
    insider = []
    for k in INSIDER_PEOPLE:
        if k >= people.size:
            break
        known = rng.permutation(people)[:k]
        pairs = np.isin(ytr, known)
        q_hat = procrustes(Ztr[pairs], sites[0].train[pairs])
        others = ~np.isin(yte, known)
        insider.append({"k": int(k), "pairs": int(pairs.sum()),
                        "reid": _reid(basis, dom, ctx.clean_mlp, sites[0].test[others] @ q_hat, yte[others]),
                        # The same people with the true key: what a perfect estimate would buy.
                        "reid_with_key": _reid(basis, dom, ctx.clean_mlp, sites[0].test[others] @ q0, yte[others]),
                        "key_error": float(np.linalg.norm(q_hat - q0) / np.sqrt(k_dim))})  # fmt: skip
    photos = []
    person = people[int(np.argmax(np.bincount(ytr)[people]))]
    own = np.flatnonzero(ytr == person)
    others = yte != person
    for m in INSIDER_PHOTOS:
        if m > own.size:
            break
        pick = rng.permutation(own)[:m]
        q_hat = procrustes(Ztr[pick], sites[0].train[pick])
        photos.append({"photos": int(m),
                       "reid": _reid(basis, dom, ctx.clean_mlp, sites[0].test[others] @ q_hat, yte[others]),
                       "reid_with_key": _reid(basis, dom, ctx.clean_mlp, sites[0].test[others] @ q0, yte[others]),
                       "key_error": float(np.linalg.norm(q_hat - q0) / np.sqrt(k_dim))})  # fmt: skip

    # (b) public background: the stored background groups against the public people they came from.
    background: dict[str, Any] = {"reid": None, "groups_matched": None, "note": "no background population"}
    if has_bg:
        stored_bg = release(Zbg, keys[0])
        q_hat, matched = _background_attack(stored_bg, data.background_labels, Zbg, data.background_labels, rng)
        background = {
            "reid": _reid(basis, dom, ctx.clean_mlp, sites[0].test @ q_hat, yte),
            "groups_matched": matched,
            "key_error": float(np.linalg.norm(q_hat - q0) / np.sqrt(k_dim)),
            "groups": int(np.unique(data.background_labels).size),
        }

    # (c) distribution only: the stored releases' moments against the public faces'.
    public = Zbg if has_bg else Ztr
    q_hat = _distribution_attack(np.vstack([sites[0].train, sites[0].test]), public)
    distribution = {
        "reid": _reid(basis, dom, ctx.clean_mlp, sites[0].test @ q_hat, yte),
        "key_error": float(np.linalg.norm(q_hat - q0) / np.sqrt(k_dim)),
    }

    g = mech.guarantee
    return {
        "epsilon": float(epsilon),
        "epsilon_coordinate": float(g.epsilon_coordinate),
        "epsilon_vector": float(g.epsilon_vector),
        "accuracy_unkeyed": acc["unkeyed"],
        "accuracy_keyed": acc["keyed"],
        "renewal_accuracy_new_key": acc["renewed"],
        "renewal_accuracy_old_key": acc["old_key_under_new_model"],
        "dsys_same_key": d_same,
        "dsys_cross_key": d_cross,
        "unlinkability_people": unlinkability_people,
        "retrieval_reid_unkeyed": reid_unkeyed,
        "retrieval_reid_with_key": reid_with,
        "retrieval_reid_without_key": reid_without,
        "chance": chance,
        "attacks": {
            "insider_procrustes": insider,
            "insider_procrustes_photos": photos,
            "public_background": background,
            "distribution_only": distribution,
        },
        "_cpu_s": time.process_time() - t0,
    }


def protection_job(ctx: Any, cfg: AuditConfig, data: Any, epsilon: float, key: tuple[int, ...]) -> tuple[Any, float]:
    """:func:`evaluate_protection` at ``epsilon`` as a job of :func:`~peep.lab.audit.execution.run_jobs`.

    Module-level so that a worker process can unpickle it by name.

    Returns
    -------
    result : dict
        The site keys' measures on split ``ctx`` at one ε.
    cpu : float
        CPU seconds the job took.
    """
    from peep.lab.audit.execution import job_env

    t = time.process_time()
    with job_env(cfg):
        out = evaluate_protection(ctx, cfg, data, kind=cfg.mechanism, epsilon=epsilon, key=key)
    return out, time.process_time() - t


def combine(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the splits (and each split's values under ``per_repeat``), attack curves point by point."""

    def mean(vals: list[Any]) -> Any:
        vals = [v for v in vals if v is not None]
        return float(np.mean(vals)) if vals else None

    scalar = [k for k, v in rows[0].items() if isinstance(v, int | float) and not k.startswith("_")]
    out: dict[str, Any] = {k: mean([r[k] for r in rows]) for k in scalar}
    out["std"] = {k: float(np.std([r[k] for r in rows])) for k in scalar if k.startswith(("accuracy", "dsys", "retr"))}
    out["accuracy_difference"] = out["accuracy_keyed"] - out["accuracy_unkeyed"]
    out["per_repeat"] = {k: [r[k] for r in rows] for k in scalar}
    attacks: dict[str, Any] = {}
    for name in ("insider_procrustes", "insider_procrustes_photos"):
        axis = "k" if name == "insider_procrustes" else "photos"
        points: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            for p in r["attacks"][name]:
                points.setdefault(p[axis], []).append(p)
        attacks[name] = [
            {axis: x, **{f: mean([p.get(f) for p in ps]) for f in ps[0] if f != axis}}
            for x, ps in sorted(points.items())
        ]
    for name in ("public_background", "distribution_only"):
        first = rows[0]["attacks"][name]
        attacks[name] = {f: (mean([r["attacks"][name].get(f) for r in rows]) if isinstance(v, int | float) or v is None
                             else v) for f, v in first.items()}  # fmt: skip
    out["attacks"] = attacks
    return out
