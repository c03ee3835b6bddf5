"""The documented schema of ``anonymize.json`` (JSON Schema 2020-12).

``peep anonymize evaluate`` validates its document against
:data:`ANONYMIZE_SCHEMA` before writing it and writes the schema next to it as
``anonymize.schema.json``. Accuracies are fractions in [0, 1]; every
attribute accuracy carries its balanced accuracy and the majority rate;
every identity accuracy has its chance in the method's ``chance`` object.
"""

from __future__ import annotations

from typing import Any

from peep.lab.anonymize.evaluation import PERCENT_PARROT, RECOGNISERS, STRATEGIES
from peep.lab.audit.schema import object_schema, validate_document

_frac: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": 1}
_num: dict[str, Any] = {"type": "number"}

_attr = object_schema({"accuracy": _frac, "balanced_accuracy": _frac, "majority": _frac})
_recognisers = {
    "type": "object",
    "properties": {**{k: _frac for k in RECOGNISERS}, "max": _frac},
    "required": ["max"],
    "additionalProperties": False,
    "minProperties": 4,
    "description": "accuracy of each recogniser (at least three) and the best of them",
}
_reduced = {
    "type": "object",
    "properties": {
        s: {
            "type": "object",
            "additionalProperties": object_schema(
                {"mean": _frac, "std": {"type": "number", "minimum": 0}, "chance": _frac, "chance_majority": _frac}
            ),
            "description": "candidate-set size -> best parrot accuracy over the draws",
        }
        for s in STRATEGIES
    },
    "required": list(STRATEGIES),
}
_mixture = object_schema(
    {
        "accuracy": _frac,
        "original_accuracy": _frac,
        "mixture": _frac,
        "random_guess": _frac,
        "top_k": {"type": "object", "additionalProperties": _frac},
        "top_k_random": {"type": "object", "additionalProperties": _frac},
        "top_k_prior": {"type": "object", "additionalProperties": _frac},
        "kl_from_random": {"type": "number", "minimum": 0},
        "kl_from_prior": _num,
    }
)

METHOD_SCHEMA: dict[str, Any] = object_schema(
    {
        "method": {"type": "string"},
        "parameters": {"type": "object"},
        "guarantee": {"type": "string"},
        "representation": {"enum": ["eigenfaces", "pixels"]},
        "anonymise_seconds": {"type": "number", "minimum": 0},
        "attribute_accuracy": object_schema(
            {"original_model_on_anonymised": _attr, "trained_on_anonymised": _attr, "original_on_original": _attr}
        ),
        "identity_mixture": _mixture,
        "naive_accuracy": _recognisers,
        "parrot_accuracy": _recognisers,
        "percent_parrot": object_schema({str(p): _recognisers for p in PERCENT_PARROT}, extra=False),
        "reduced_sets": _reduced,
        "chance": object_schema(
            {
                "identity_majority": _frac,
                "identity_uniform": _frac,
                "attribute_majority": _frac,
                "attribute_uniform": _frac,
            }
        ),
        "ssim_mean": {"type": "number", "minimum": -1, "maximum": 1},
        "own_protocol": object_schema(
            {
                "protocol": {"type": "string"},
                "n_pairs": {"type": "integer", "minimum": 1},
                "accuracy_real": _frac,
                "accuracy_privatized": _frac,
                "fooling_rate": _frac,
                "false_different_real": _frac,
            }
        ),
    },
    required=[
        "method",
        "parameters",
        "guarantee",
        "representation",
        "anonymise_seconds",
        "attribute_accuracy",
        "identity_mixture",
        "naive_accuracy",
        "parrot_accuracy",
        "percent_parrot",
        "reduced_sets",
        "chance",
        "ssim_mean",
    ],
)
_frac_or_null: dict[str, Any] = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
_sgap_point = object_schema(
    {
        "row": {"type": "string"},
        "lambda": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "ssim_mean": {"type": "number", "minimum": -1, "maximum": 1},
        "fooling_rate": _frac_or_null,
        "discriminator_accuracy_real": _frac_or_null,
        "owner_identity_accuracy": _frac,
        "naive_accuracy_max": _frac,
        "parrot_accuracy_max": _frac,
        "attribute_original_model_on_anonymised": _attr,
        "attribute_trained_on_anonymised": _attr,
    }
)

_sweep_point = object_schema(
    {
        "parameters": object_schema(
            {"t": _frac, "g": {"type": "integer", "minimum": 1}, "r_p": _frac, "w": {"type": "number", "minimum": 1}}
        ),
        "identity_accuracy_source": _frac,
        "identity_mixture": _frac,
        "parrot_accuracy": {"type": "object", "required": ["max"], "additionalProperties": _frac},
        "attribute_original_model_on_anonymised": _attr,
        "attribute_trained_on_anonymised": _attr,
        "ssim_mean": {"type": "number"},
    }
)

ANONYMIZE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://peep.invalid/schemas/anonymize-1.json",
    "title": "peep anonymize evaluate result",
    "description": __doc__,
    **object_schema(
        {
            "schema_version": {"const": 1},
            "tool": object_schema({"name": {"type": "string"}, "version": {"type": "string"}}),
            "created": {"type": "string"},
            "command": {"type": ["array", "null"], "items": {"type": "string"}},
            "dataset": object_schema(
                {
                    "source": {"type": "string"},
                    "n_subjects": {"type": "integer", "minimum": 2},
                    "n_images": {"type": "integer", "minimum": 2},
                    "attribute": {"type": "string"},
                    "attribute_values": {"type": "array", "items": {"type": "string"}},
                    "attribute_counts": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "balanced": {"type": "boolean"},
                    "labels": {"type": "string"},
                }
            ),
            "protocol": object_schema(
                {
                    "test_size": _frac,
                    "seed": {"type": "integer"},
                    "recognisers": {"type": "object", "minProperties": 3},
                    "strategies": {"type": "array", "items": {"enum": list(STRATEGIES)}},
                    "draws": {"type": "integer", "minimum": 1},
                }
            ),
            "original": object_schema(
                {"identity_accuracy": _recognisers, "owner_identity_accuracy": _frac, "attribute": _attr}
            ),
            "methods": {"type": "object", "additionalProperties": METHOD_SCHEMA, "minProperties": 1},
            "sweep": {
                "oneOf": [
                    {"type": "null"},
                    object_schema({"method": {"const": "upba"}, "points": {"type": "array", "items": _sweep_point}}),
                ]
            },
            "sgap_sweep": {
                "oneOf": [
                    {"type": "null"},
                    object_schema({"method": {"const": "sgap"}, "points": {"type": "array", "items": _sgap_point}}),
                ]
            },
            "findings": {"type": "array", "items": {"type": "string"}},
            "timing": object_schema(
                {"wall_seconds": {"type": "number", "minimum": 0}, "cpu_seconds": {"type": "number", "minimum": 0}}
            ),
            "plots": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    ),
}


class AnonymizeSchemaError(ValueError):
    """``anonymize.json`` content does not match :data:`ANONYMIZE_SCHEMA` (names the path)."""


def validate_anonymize(document: Any) -> None:
    """Raise :class:`AnonymizeSchemaError` naming the first offending path, if ``document`` is invalid."""
    validate_document(document, ANONYMIZE_SCHEMA, "anonymize.json", AnonymizeSchemaError)
