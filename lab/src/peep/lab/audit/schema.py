"""The documented schema of ``audit.json`` (JSON Schema 2020-12).

``peep audit`` validates its document against :data:`AUDIT_SCHEMA` before
writing it and writes the schema next to it as ``audit.schema.json``.

Conventions: every ``results[]``, ``bystander[]`` and ``open_set[]`` entry (and every sweep/frontier point) holds
means over the repeated splits, and a ``std`` object of the same shape holding
the standard deviations. ε appears as ``epsilon`` (the mechanism's parameter),
``epsilon_coordinate`` and ``epsilon_vector`` (what the release guarantees per
coordinate and per vector). Accuracies are fractions in [0, 1].
"""

from __future__ import annotations

from typing import Any

from peep.core.mechanisms import mechanism_kinds
from peep.server.recognition.presets import PRESETS

_num: dict[str, Any] = {"type": "number"}
_frac: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}
_frac_or_null: dict[str, Any] = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
_pos: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0}

_ADVERSARY_KEYS = ["knn", "svm", "logreg", "mlp", "bayes", "max"]


def object_schema(props: dict[str, Any], required: list[str] | None = None, extra: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "required": required or list(props)}
    if not extra:
        out["additionalProperties"] = False
    return out


_recon = object_schema({"ssim": {"type": "number", "minimum": -1, "maximum": 1}, "psnr": _num, "reid": _frac})
_linkage = object_schema({k: _frac for k in _ADVERSARY_KEYS})
_subset = object_schema(
    {
        "size": {"type": "integer", "minimum": 2},
        "strategy": {"enum": ["all", "random", "distinctive", "center"]},
        "subjects": {
            "type": "array",
            "items": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "description": "identity indices of the set, one list per repeat",
        },
        **{k: _frac_or_null for k in _ADVERSARY_KEYS},
        "chance": _frac_or_null,
        "chance_uniform": _frac,
        "std": {"type": "object"},
    }
)
_mixture = object_schema(
    {
        "mixture": _frac,
        "random_guess": _frac,
        "top_k": {"type": "object", "additionalProperties": _frac},
        "top_k_random": {"type": "object", "additionalProperties": _frac},
        "top_k_prior": {"type": "object", "additionalProperties": _frac},
        "kl_from_random": {"type": "number", "minimum": 0},
        "kl_from_prior": _num,
    }
)

_RESULT_KEYS = (
    "epsilon epsilon_coordinate epsilon_vector delta noise_std n_components accuracy balanced_accuracy weighted_f1 "
    "weighted_precision weighted_recall chance chance_uniform reconstruction_ssim reconstruction_psnr "
    "reconstruction_reid reconstruction linkage linkage_subsets averaging averaging_detail membership_auc "
    "membership_auc_template identity_mixture n_repeats std per_repeat"
).split()

RESULT_SCHEMA: dict[str, Any] = object_schema(
    {
        "epsilon": {**_pos, "description": "the mechanism's ε parameter (per coordinate for peep/peep-raw)"},
        "epsilon_coordinate": {**_pos, "description": "guaranteed ε of any one released coordinate"},
        "epsilon_vector": {**_pos, "description": "guaranteed ε of the whole released template"},
        "delta": {"type": "number", "minimum": 0, "maximum": 1},
        "noise_std": {"type": "number", "minimum": 0},
        "n_components": {"type": "integer", "minimum": 1},
        "accuracy": _frac,
        "balanced_accuracy": _frac,
        "weighted_f1": _frac,
        "weighted_precision": _frac,
        "weighted_recall": _frac,
        "chance": {**_frac, "description": "majority-class rate of the test set"},
        "chance_uniform": _frac,
        "reconstruction_ssim": {"type": "number", "description": "best attack's mean SSIM"},
        "reconstruction_psnr": _num,
        "reconstruction_reid": _frac,
        "reconstruction": object_schema({"direct": _recon, "shrinkage": _recon}),
        "linkage": _linkage,
        "linkage_subsets": {"type": "array", "items": _subset, "minItems": 1},
        "averaging": {
            "type": "object",
            "required": ["1", "5", "20"],
            "additionalProperties": _frac,
            "description": "best adversary's accuracy when k releases are averaged, keyed by k",
        },
        "averaging_detail": {"type": "object"},
        "membership_auc": {**_frac, "description": "threshold attack, fresh release of member photos"},
        "membership_auc_template": {**_frac, "description": "threshold attack, the stored member templates"},
        "identity_mixture": _mixture,
        "n_repeats": {"type": "integer", "minimum": 1},
        "std": {"type": "object", "required": ["accuracy", "weighted_f1", "linkage"]},
        "per_repeat": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": _frac},
            "description": "headline numbers of each split (accuracy, balanced_accuracy, weighted_f1, linkage_max)",
        },
    },
    [k for k in _RESULT_KEYS if k != "per_repeat"],
)

_sweep_point = object_schema(
    {
        "value": {"type": "integer"},
        "n_components": {"type": "integer"},
        "epsilon": _pos,
        "epsilon_coordinate": _pos,
        "epsilon_vector": _pos,
        "no_privacy": object_schema({"accuracy": _frac, "weighted_f1": _frac}),
        "private": object_schema({"accuracy": _frac, "weighted_f1": _frac}),
        "std": {"type": "object"},
    }
)

_frontier_point = object_schema(
    {
        "epsilon_vector": _pos,
        "best": {**RESULT_SCHEMA, "required": [*RESULT_SCHEMA["required"], "configuration"]},
        "paper_mode": {**RESULT_SCHEMA, "required": [*RESULT_SCHEMA["required"], "configuration"]},
    }
)

_BYSTANDER_LINK_METHODS = ["cosine", "parrot_lda", "parrot_plda", "combined"]
_BYSTANDER_EVENT_METHODS = ["probability", "decision_probability"]
_count: dict[str, Any] = {"type": "number", "minimum": 0}
_link_scores = object_schema(
    {
        "precision": {**_frac_or_null, "description": "share of same-cluster pairs that are one person (null: none)"},
        "recall": {**_frac_or_null, "description": "share of one person's pairs put in one cluster"},
        "f1": _frac_or_null,
        "threshold": {
            "type": ["number", "null"],
            "description": "similarity (the method's units) above which clusters merge, chosen on calibration people",
        },
        "pair_auc": {
            **_frac_or_null,
            "description": "threshold-free: P(a same-person pair scores above a two-person pair)",
        },
        "n_clusters": {"type": "number", "minimum": 1},
        "chance_f1": {**_frac_or_null, "description": "a random clustering with the same cluster sizes"},
    }
)


def _methods(names: list[str]) -> dict[str, Any]:
    return object_schema({n: _link_scores for n in names})


def _best(names: list[str], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return object_schema(
        {
            "method": {"enum": names},
            "precision": _frac_or_null,
            "recall": _frac_or_null,
            "f1": _frac_or_null,
            **(extra or {}),
        }
    )


_events = object_schema(
    {
        "methods": _methods(_BYSTANDER_EVENT_METHODS),
        "events": _best(_BYSTANDER_EVENT_METHODS, {"chance_precision": _frac}),
    }
)
_kept = object_schema({"templates_kept": _count, "share": _frac})
_BYSTANDER_DECISION_METHODS = ["same_label", "same_named_label"]
_decision_label = object_schema(
    {
        "epsilon_label": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "description": "ε of the k-RR each decision is released through (null: no label mechanism)",
        },
        "feasible": {
            "type": "boolean",
            "description": "false where k-RR alone names more strangers than the device's FPIR target allows",
        },
        "fpir_floor": _frac,
        "named_share_model": {**_frac, "description": "appearances the device's model names as someone"},
        "named_share": {**_frac, "description": "appearances released as some enrolled subject's label"},
        "methods": _methods(_BYSTANDER_DECISION_METHODS),
        "best": _best(_BYSTANDER_DECISION_METHODS),
        "std": {"type": "object"},
        "per_repeat": {"type": "object", "additionalProperties": {"type": "array", "items": _frac_or_null}},
    }
)

BYSTANDER_SCHEMA: dict[str, Any] = object_schema(
    {
        "epsilon": _pos,
        "epsilon_coordinate": _pos,
        "epsilon_vector": {**_pos, "description": "guaranteed ε of each released template"},
        "n_components": {"type": "integer", "minimum": 1},
        "n_strangers": {
            "type": "number",
            "minimum": 2,
            "description": "never-enrolled people whose appearances are linked",
        },
        "n_appearances": {"type": "number", "minimum": 2},
        "n_pairs": {"type": "number", "minimum": 1},
        "n_same_pairs": _count,
        "n_calibration": {"type": "number", "minimum": 2},
        "n_public": {"type": "number", "minimum": 2},
        "chance_precision": {**_frac, "description": "share of the strangers' pairs that are one person"},
        "chance_f1": {**_frac, "description": "best data-blind clustering (all in one cluster): 2P / (1 + P)"},
        "keep_all": object_schema(
            {
                "templates_kept": {"type": "number", "minimum": 1},
                "methods": _methods(_BYSTANDER_LINK_METHODS),
                "best": _best(_BYSTANDER_LINK_METHODS),
                "chance_precision": _frac,
            }
        ),
        "keep_none": object_schema(
            {
                "templates_kept": {"const": 0},
                "methods": _methods(_BYSTANDER_EVENT_METHODS),
                "events": _best(_BYSTANDER_EVENT_METHODS, {"chance_precision": _frac}),
                "background_class": _events,
            }
        ),
        "keep_recognised": object_schema({"templates_kept": _count, "share": _frac, "background_class": _kept}),
        "keep_decision": object_schema(
            {
                "templates_kept": {"const": 0},
                "labels_kept": {**_count, "description": "one released label per appearance"},
                "labels": {"type": "integer", "minimum": 2, "description": "enrolled subjects and unknown"},
                "fpir_target": _frac,
                "per_label": {"type": "array", "items": _decision_label, "minItems": 1},
            }
        ),
        "n_repeats": {"type": "integer", "minimum": 1},
        "std": {"type": "object"},
        "per_repeat": {"type": "object", "additionalProperties": {"type": "array", "items": _frac_or_null}},
    }
)

_reid_point = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
PROTECTION_SCHEMA: dict[str, Any] = object_schema(
    {
        "epsilon": _pos,
        "epsilon_coordinate": _pos,
        "epsilon_vector": _pos,
        "accuracy_unkeyed": _frac,
        "accuracy_keyed": _frac,
        "accuracy_difference": {"type": "number", "minimum": -1, "maximum": 1},
        "renewal_accuracy_new_key": _frac,
        "renewal_accuracy_old_key": _frac,
        "dsys_same_key": _frac,
        "dsys_cross_key": _frac,
        "retrieval_reid_unkeyed": _frac,
        "retrieval_reid_with_key": _frac,
        "retrieval_reid_without_key": _frac,
        "chance": _frac,
        "attacks": object_schema(
            {
                "insider_procrustes": {
                    "type": "array",
                    "items": object_schema({"k": {"type": "integer", "minimum": 1}, "reid": _reid_point}, extra=True),
                },
                "insider_procrustes_photos": {
                    "type": "array",
                    "items": object_schema(
                        {"photos": {"type": "integer", "minimum": 1}, "reid": _reid_point}, extra=True
                    ),
                },
                "public_background": object_schema({"reid": _reid_point}),
                "distribution_only": object_schema({"reid": _reid_point}),
            }
        ),
        "std": {"type": "object"},
        "per_repeat": {"type": "object"},
    }
)

_rate_list = {"type": "array", "items": _frac_or_null}
_eps_label = {
    "type": ["number", "null"],
    "exclusiveMinimum": 0,
    "description": "ε of the device's k-ary randomized response on the decision label (null: no label mechanism)",
}
OPEN_SET_SCHEMA: dict[str, Any] = {
    **object_schema(
        {
            "mode": {
                "enum": ["server", "device"],
                "description": "server: the model decides on a released query; device: on the clean projection, "
                "releasing only the label",
            },
            "preset": {"enum": list(PRESETS), "description": "recogniser preset, fitted by the server's trainer"},
            "n_components": {"type": "integer", "minimum": 1},
            "epsilon_template": {**_pos, "description": "the mechanism's ε for every released template"},
            "epsilon_template_vector": _pos,
            "epsilon_label": _eps_label,
            "fpir_target": {**_frac, "description": "the false-positive identification rate aimed at"},
            "fpir": {**_frac, "description": "share of strangers released (server: decided) as an enrolled subject"},
            "fnir": {**_frac, "description": "share of probes not released (decided) as their own subject"},
            "fpir_model": {**_frac, "description": "strangers the model names, before the label mechanism"},
            "fpir_single": {
                **_frac,
                "description": "the same as fpir for the one-capture strangers drawn from LFW's one-image people "
                "(present where the singles calibrate)",
            },
            "fpir_model_single": _frac,
            "single_strangers": {"type": "integer", "minimum": 1, "description": "one-image strangers per split"},
            "enrol_images": {
                "type": "integer",
                "minimum": 2,
                "description": "enrolment releases per enrolled person the model learnt from",
            },
            "fpir_model_target": _frac,
            "fpir_floor": {**_frac, "description": "strangers the label mechanism alone names (0 without one)"},
            "fpir_calibration": _frac,
            "fpir_bound": {
                **_frac,
                "description": "the least FPIR any ε_label-LDP label mechanism releases at this row's FNIR: "
                "enrolled · e^−ε_label · (1 − FNIR) (0 without a label mechanism)",
            },
            "feasible": {
                "type": "boolean",
                "description": "false where fpir_floor >= fpir_target: no threshold meets the target, the row "
                "uses the threshold without the label accounting",
            },
            "threshold": {"type": "number"},
            "rank1_miss": {**_frac, "description": "probes whose best enrolled subject is someone else (no threshold)"},
            "enrolled": {"type": "integer", "minimum": 2},
            "probes": {"type": "integer", "minimum": 1, "description": "probes per split"},
            "strangers": {"type": "integer", "minimum": 1, "description": "one-capture strangers per split"},
            "background_templates": {"type": "number", "minimum": 0},
            "calibration_faces": {"type": "number", "minimum": 0},
            "gar_at_far": {**_frac, "description": "door: share of probes' own claims accepted"},
            "far": {**_frac, "description": "door: share of probes' claims to other enrolled subjects accepted"},
            "far_target": _frac,
            "n_repeats": {"type": "integer", "minimum": 1},
            "std": object_schema({"fnir": _frac_or_null, "fpir": _frac_or_null}, extra=True),
            "per_repeat": object_schema({"fnir": _rate_list, "fpir": _rate_list}, extra=True),
        },
        (
            "mode preset n_components epsilon_template epsilon_label fpir_target fpir fnir fpir_model fpir_floor "
            "feasible enrolled probes strangers enrol_images n_repeats std per_repeat"
        ).split(),
    ),
    # A server decides on the released template: it has no label mechanism.
    "if": {"properties": {"mode": {"const": "server"}}},
    "then": {"properties": {"epsilon_label": {"type": "null"}}},
}
_NO_NOISE_SCHEMA: dict[str, Any] = {
    **object_schema(
        {
            **OPEN_SET_SCHEMA["properties"],
            "mode": {"const": "no_noise"},
            "epsilon_template": {"type": "null"},
            "epsilon_template_vector": {"type": "null"},
            "epsilon_label": {"type": "null"},
        },
        OPEN_SET_SCHEMA["required"],
    ),
}

_NOISE_COST_SCHEMA: dict[str, Any] = {
    **object_schema(
        {
            **OPEN_SET_SCHEMA["properties"],
            "mode": {
                "enum": ["clean_means", "clean_covariance"],
                "description": "the served linear discriminant deciding on clean queries with its class means "
                "(clean_means) or its shared covariance (clean_covariance) taken from the model fitted on clean "
                "templates: where the template noise costs FNIR",
            },
        },
        OPEN_SET_SCHEMA["required"],
    ),
}

AUDIT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://peep.invalid/schemas/audit-1.json",
    "title": "peep audit result",
    "description": __doc__,
    **object_schema(
        {
            "schema_version": {"const": 1},
            "tool": object_schema({"name": {"type": "string"}, "version": {"type": "string"}}),
            "created": {"type": "string"},
            "command": {"type": ["array", "null"], "items": {"type": "string"}},
            "config": {"type": "object"},
            "dataset": object_schema(
                {
                    "source": {"type": "string"},
                    "n_subjects": {"type": "integer", "minimum": 2},
                    "n_images": {"type": "integer", "minimum": 2},
                    "subjects": {"type": "array", "items": {"type": "string"}},
                    "images_per_subject": {"type": "array", "items": {"type": "integer"}},
                    "normalisation": {"type": "object"},
                    "n_skipped": {"type": "integer", "minimum": 0},
                }
            ),
            "mechanism": object_schema(
                {
                    "kind": {"enum": list(mechanism_kinds())},
                    "delta": {"type": "number", "minimum": 0, "maximum": 1},
                    "epsilon_parameter": {"enum": ["per coordinate", "per vector"]},
                    "description": {"type": "string"},
                }
            ),
            "components": {"type": "integer", "minimum": 1},
            "basis": object_schema(
                {"source": {"enum": ["train", "background"]}, "note": {"type": "string"}}, ["source", "note"]
            ),
            "protocol": object_schema(
                {
                    "repeats": {"type": "integer", "minimum": 1},
                    "test_size": _frac,
                    "preset": {
                        "enum": list(PRESETS),
                        "description": "recogniser preset (peep.server.recognition.presets.PRESETS), fitted by "
                        "the server's fit_recogniser",
                    },
                    "recogniser": {"type": "string", "description": "the preset's description"},
                    "recogniser_parameters": {"type": "object", "description": "the preset's parameters"},
                    "recogniser_training": {"type": "string"},
                }
            ),
            "sampler": object_schema(
                {
                    "name": {"enum": ["seeded", "secure"]},
                    "is_secure": {"type": "boolean"},
                    "seeded_noise_feature": {"type": "boolean"},
                    "note": {"type": "string"},
                }
            ),
            "chance": object_schema({"majority": _frac, "uniform": _frac}),
            "no_privacy": object_schema(
                {
                    "accuracy": _frac,
                    "weighted_f1": _frac,
                    "weighted_precision": _frac,
                    "weighted_recall": _frac,
                    "balanced_accuracy": _frac,
                    "membership_auc": _frac,
                    "std": {"type": "object"},
                }
            ),
            "reconstruction_baselines": object_schema({"mean_face": _recon, "pca_ceiling": _recon}),
            "linkage_subsets_skipped": {"type": "array"},
            "results": {"type": "array", "items": RESULT_SCHEMA, "minItems": 1},
            "sweeps": object_schema(
                {
                    "epsilon": _pos,
                    "mechanism": {"type": "string"},
                    "components": {"type": "array", "items": _sweep_point},
                    "images_per_subject": {"type": "array", "items": _sweep_point},
                }
            ),
            "frontier": {
                "oneOf": [
                    {"type": "null"},
                    object_schema(
                        {
                            "points": {"type": "array", "items": _frontier_point},
                            "searched": {"type": "object"},
                            "selection": {"type": "object"},
                        }
                    ),
                ]
            },
            "bystander": {
                "oneOf": [
                    {"type": "null"},
                    {"type": "array", "items": BYSTANDER_SCHEMA, "minItems": 1},
                ],
                "description": "per ε: how well an operator holding what the server kept links a stranger's "
                "appearances (null with --no-bystander)",
            },
            "bystander_setup": {
                "oneOf": [
                    {"type": "null"},
                    object_schema(
                        {
                            "population": {"type": "object"},
                            "groups": {"type": "object"},
                            "appearances": {"type": "object"},
                            "basis": {"type": "string"},
                            "note": {"type": "string"},
                        }
                    ),
                ]
            },
            "template_protection": {
                "oneOf": [{"type": "null"}, {"type": "array", "items": PROTECTION_SCHEMA, "minItems": 1}],
                "description": "per ε with --site-keys: ISO/IEC 24745's properties under site keys and attacks on "
                "the key (null without)",
            },
            "open_set": {
                "oneOf": [{"type": "null"}, {"type": "array", "items": OPEN_SET_SCHEMA, "minItems": 1}],
                "description": "with --open-set: FNIR at fixed FPIR (NIST FRVT 1:N) of the server deciding on a "
                "released query and of a device deciding on its clean projection, releasing only the label (null "
                "without)",
            },
            "open_set_setup": {
                "oneOf": [
                    {"type": "null"},
                    object_schema(
                        {
                            "rule": {"type": "string"},
                            "people": {"type": "object"},
                            "faces": {"type": "object"},
                            "calibration": object_schema(
                                {
                                    "population": {
                                        "enum": ["singles", "public"],
                                        "description": "singles: LFW's one-image people; public: the public LFW "
                                        "people the background class does not take",
                                    },
                                    "people": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                                    "faces": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                                    "weights": {"type": "string"},
                                }
                            ),
                            "basis": {"type": "string"},
                            "label_mechanism": {"type": "object"},
                            "decision_preset": {
                                "oneOf": [
                                    {"type": "null"},
                                    object_schema(
                                        {
                                            "winner": {"enum": list(PRESETS)},
                                            "criterion": {"type": "string"},
                                            "mean_fnir": {"type": "object", "additionalProperties": _frac},
                                            "margin": {"type": ["number", "null"]},
                                        }
                                    ),
                                ]
                            },
                            "no_noise": {"type": "array", "items": _NO_NOISE_SCHEMA},
                            "noise_cost": {"type": "array", "items": _NOISE_COST_SCHEMA},
                            "enrolment_sweep": {
                                "type": "array",
                                "items": OPEN_SET_SCHEMA,
                                "description": "the server and device rows of models learning from fewer "
                                "enrolment releases per person (enrol_images), the same probes and strangers",
                            },
                            "note": {"type": "string"},
                        }
                    ),
                ]
            },
            "timing": object_schema(
                {
                    "wall_seconds": {"type": "number", "minimum": 0},
                    "cpu_seconds": {"type": "number", "minimum": 0},
                    "workers": {"type": "integer", "minimum": 1},
                }
            ),
            "plots": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    ),
}


class AuditSchemaError(ValueError):
    """``audit.json`` content does not match :data:`AUDIT_SCHEMA` (names the path)."""


def validate_audit(document: Any) -> None:
    """Raise :class:`AuditSchemaError` naming the first offending path, if ``document`` is invalid."""
    validate_document(document, AUDIT_SCHEMA, "audit.json", AuditSchemaError)


def validate_document(document: Any, schema: dict[str, Any], name: str, error: type[ValueError]) -> None:
    """Raise ``error`` naming ``name`` and the first offending path, if ``document`` does not match ``schema``."""
    import jsonschema  # type: ignore[import-untyped]

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise error(f"{name}: {where}: {e.message}")
