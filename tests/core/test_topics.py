"""The one MQTT topic grammar: names, filters, parsing back, validation naming the field."""

from __future__ import annotations

import pytest
from peep.core.exceptions import TopicError
from peep.core.topics import DEFAULT_ROOT, DeviceTopic, TopicScheme, check_root, check_share_group


@pytest.mark.parametrize("root", [DEFAULT_ROOT, "acme/peep/v2", "x"])
def test_names_and_filters_hang_off_the_root(root):
    t = TopicScheme(root)
    assert t.templates("lobby", "cam-1") == f"{root}/lobby/cam-1/templates"
    assert t.status("lobby", "cam-1") == f"{root}/lobby/cam-1/status"
    assert t.events("lobby", "cam-1") == f"{root}/lobby/cam-1/events"
    assert t.bundle == f"{root}/bundle"
    assert t.deadletter == f"{root}/deadletter"
    assert t.shared_templates_filter("peep-server") == f"$share/peep-server/{root}/+/+/templates"


def test_default_root_is_peep_v1():
    assert TopicScheme().root == "peep/v1"


@pytest.mark.parametrize("leaf", ["templates", "status", "events"])
def test_parse_inverts_the_names(leaf):
    t = TopicScheme("a/b")
    assert t.parse(t.device("site.1", "cam:2@x", leaf)) == DeviceTopic("site.1", "cam:2@x", leaf)
    assert t.parse(t.device("s", "d", leaf), leaf=leaf).leaf == leaf


@pytest.mark.parametrize(
    "topic",
    [
        "peep/v1/lobby/cam-1/templates",  # another root
        "a/b/lobby/cam-1",  # too short
        "a/b/lobby/cam-1/templates/extra",  # too long
        "a/b/lobby/-cam/templates",  # not an identifier
        "a/b//cam-1/templates",  # empty level
        "a/b/lobby/cam-1/status",  # wrong leaf for the caller
        "a/bc/lobby/cam-1/templates",  # root must match level by level
        "a/b",
    ],
)
def test_parse_rejects_topics_outside_the_grammar_naming_the_field_and_value(topic):
    with pytest.raises(TopicError, match=r"^topic: expected a/b/<site>/<device>/templates .*received") as info:
        TopicScheme("a/b").parse(topic, leaf="templates")
    assert repr(topic[:200]) in str(info.value)


@pytest.mark.parametrize("root", ["", "/peep", "peep/", "peep/+", "peep/#", "$SYS/peep"])
def test_bad_roots_are_refused_naming_the_field(root):
    with pytest.raises(TopicError, match=r"^root: expected topic levels .* received"):
        TopicScheme(root)
    with pytest.raises(ValueError, match=r"^mqtt.topic_prefix: expected topic levels"):
        check_root(root, field="mqtt.topic_prefix")


@pytest.mark.parametrize("group", ["", "a/b", "a+", "#", "$g"])
def test_bad_share_groups_are_refused(group):
    with pytest.raises(TopicError, match=r"^share_group: expected a group name"):
        TopicScheme().shared_templates_filter(group)
    with pytest.raises(TopicError, match=r"^mqtt.share_group:"):
        check_share_group(group, field="mqtt.share_group")


@pytest.mark.parametrize(("site", "device"), [("lob/by", "cam"), ("lobby", "cam+"), ("lobby", "#"), ("", "cam")])
def test_ids_that_would_widen_a_topic_are_refused(site, device):
    with pytest.raises(TopicError, match=r"^(site|device_id): expected an identifier"):
        TopicScheme().templates(site, device)


def test_without_a_field_the_checks_state_only_the_expectation_for_config_validators():
    # pydantic (and peep.core.configfile) add the key path and the value received.
    with pytest.raises(TopicError, match=r"^expected topic levels such as 'peep/v1' \(.*\)$"):
        check_root("peep/")
    with pytest.raises(TopicError, match=r"^expected a group name without"):
        check_share_group("a/b")
    assert check_root("a/b") == "a/b" and check_share_group("g") == "g"
