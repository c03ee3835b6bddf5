"""The mechanism and projection registries are the only lists of kinds.

Everything that names kinds — the proto enum, the wire mapping, the edge and
server configuration schemas, the audit's JSON schema and frontier, the CLI
choices, the bundle's projector outputs — must come from them, so adding a
kind is one class in one module (plus its proto enum value and tests).
"""

from __future__ import annotations

import argparse

import pytest
from peep.core import wire
from peep.core.domains import DOMAINS
from peep.core.mechanisms import (
    MECHANISM_KINDS,
    TemplateMechanism,
    mechanism_class,
    mechanism_classes,
    mechanism_kinds,
    register_mechanism,
)
from peep.core.projections import projection_classes, projection_kinds, projector_outputs
from peep.v1 import template_pb2

KINDS = mechanism_kinds()


def _subparser_choices(command: str, option: str) -> tuple[str, ...]:
    """The choices of ``peep COMMAND... OPTION`` (``command`` may be ``"bundle build"``)."""
    from peep.server.cli import build_parser

    parser = build_parser()
    for word in command.split():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    action = next(a for a in parser._actions if option in a.option_strings)
    assert action.choices is not None, f"peep {command} {option} has no choices"
    return tuple(action.choices)


def test_the_registry_holds_every_kind_of_the_proto_enum_and_nothing_else():
    enum_names = {v.name for v in template_pb2.MechanismKind.DESCRIPTOR.values if v.number != 0}
    assert {cls.wire_name for cls in mechanism_classes().values()} == enum_names
    assert len(KINDS) == len(enum_names) == len(set(KINDS))
    assert wire.MECHANISM_KINDS == {k: template_pb2.MechanismKind.Value(mechanism_class(k).wire_name) for k in KINDS}
    assert MECHANISM_KINDS == KINDS


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_declares_its_contract(kind):
    cls = mechanism_class(kind)
    assert issubclass(cls, TemplateMechanism) and cls.kind == kind
    assert cls.domain in DOMAINS and cls.domain in projector_outputs()
    assert cls.epsilon_scope in ("coordinate", "vector")
    assert isinstance(cls.takes_delta, bool) and isinstance(cls.frontier, bool) and cls.summary


def test_edge_and_server_configuration_schemas_list_the_registry():
    from peep.edge.config import PrivacyConfig
    from peep.server.config import TrainingConfig

    edge = PrivacyConfig.model_json_schema()["properties"]["mechanism"]
    assert tuple(edge["enum"]) == KINDS
    server = TrainingConfig.model_json_schema()["properties"]["mechanism_kind"]
    assert tuple(next(s for s in server["anyOf"] if "enum" in s)["enum"]) == KINDS


def test_audit_schema_frontier_and_cli_choices_come_from_the_registry():
    from peep.lab.audit.config import FRONTIER_MECHANISMS
    from peep.lab.audit.schema import AUDIT_SCHEMA

    enum = AUDIT_SCHEMA["properties"]["mechanism"]["properties"]["kind"]["enum"]
    assert tuple(enum) == KINDS
    assert FRONTIER_MECHANISMS == tuple(k for k in KINDS if mechanism_class(k).frontier)
    assert "laplace-vector" not in FRONTIER_MECHANISMS  # peep's noise at ε/nc: searched once, as peep
    assert _subparser_choices("audit", "--mechanism") == KINDS
    assert _subparser_choices("demo", "--mechanism") == KINDS


def test_projection_kinds_come_from_their_registry():
    assert "eigenfaces" in projection_kinds()
    assert all(cls.kind == k and cls.summary for k, cls in projection_classes().items())
    assert _subparser_choices("bundle build", "--projection") == projection_kinds()


def test_a_class_without_its_contract_or_with_a_taken_kind_is_refused():
    class NoDomain(TemplateMechanism):
        kind = "no-domain"
        wire_name = "MECHANISM_KIND_NO_DOMAIN"
        summary = "x"

    with pytest.raises(TypeError, match="NoDomain.domain"):
        register_mechanism(NoDomain)

    class Taken(TemplateMechanism):
        kind = "peep"
        wire_name = "MECHANISM_KIND_OTHER"
        domain = "scaled"
        summary = "x"

    with pytest.raises(ValueError, match="'peep' is already registered"):
        register_mechanism(Taken)

    class UnknownDomain(TemplateMechanism):
        kind = "unknown-domain"
        wire_name = "MECHANISM_KIND_UNKNOWN_DOMAIN"
        domain = "pixels"
        summary = "x"

    with pytest.raises(TypeError, match="pixels"):
        register_mechanism(UnknownDomain)
    assert mechanism_kinds() == KINDS
