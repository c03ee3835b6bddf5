"""The subjects who opted in to be shown in Home Assistant, on SQLite and PostgreSQL: set, changed, cleared, listed,
validated, and gone with an erasure."""

from __future__ import annotations

import pytest
from peep.server.storage import ShownPerson, check_display_name
from peep.server.storage.postgres import PostgresStore
from peep.server.storage.sqlite import SqliteStore


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SqliteStore(tmp_path / "db" / "peep.db")
    else:
        s = PostgresStore(request.getfixturevalue("pg_dsn"), pool_size=2)
    yield s
    s.close()


def test_nobody_is_shown_until_they_opt_in_and_an_opt_in_round_trips(store):
    assert store.home_assistant_people() == {}  # off by default
    assert store.set_home_assistant_person("alice", "  Alice B. ", 1000.0) is True
    assert store.set_home_assistant_person("zoe\u0308", "Zoe\u0308", 1001.0) is True
    assert store.home_assistant_people() == {
        "alice": ShownPerson("alice", "Alice B.", 1000.0),  # trimmed
        "zoe\u0308": ShownPerson("zoe\u0308", "Zo\u00eb", 1001.0),  # the name in NFC
    }
    # A new name is a change, not a second row; the time is the change's.
    assert store.set_home_assistant_person("alice", "Alice", 2000.0) is False
    assert store.home_assistant_people()["alice"] == ShownPerson("alice", "Alice", 2000.0)
    assert store.clear_home_assistant_person("alice") is True
    assert store.clear_home_assistant_person("alice") is False
    assert list(store.home_assistant_people()) == ["zoe\u0308"]


@pytest.mark.parametrize("name", ["", "   ", "x" * 65, "Alice\u202eevil", "Alice\nB", "Al\u200bice", 42], ids=repr)
def test_a_display_name_is_bounded_and_has_no_control_or_bidi_character(store, name):
    with pytest.raises(ValueError, match="display_name: expected a display name of 1-64 characters"):
        store.set_home_assistant_person("alice", name, 1000.0)
    assert store.home_assistant_people() == {}


def test_a_display_name_may_be_what_a_person_is_called():
    assert check_display_name("Dr. O'Brien / Ward #3 + guest") == "Dr. O'Brien / Ward #3 + guest"
    assert check_display_name("x" * 64) == "x" * 64
    assert check_display_name("李小龍") == "李小龍"


def test_an_opt_in_alone_names_the_subject_for_an_erasure(store):
    assert not store.names_subject("alice")
    store.set_home_assistant_person("alice", "Alice", 1000.0)
    assert store.names_subject("alice") and not store.names_subject("bob")


def test_erasing_a_subject_deletes_their_opt_in(tmp_path, keypair, bundle_dir):
    """Through the server's erasure, as the console and ``peep erase`` run it: nothing else holds the subject, and
    the opt-in is enough to erase them; it is gone after, and the result says it was there."""
    from peep.server.config import load_config, resolve_secrets
    from peep.server.services import Services
    from peep_testing.server import base_config, to_toml

    cfg = base_config(tmp_path, keypair[3], bundle_dir)
    cfg["auth"]["allow_insecure"] = True
    path = tmp_path / "server.toml"
    path.write_text(to_toml(cfg))
    config = load_config(path)
    s = Services(config, secrets=resolve_secrets(config))
    try:
        s.store.set_home_assistant_person("alice", "Alice", 1000.0)
        s.store.set_home_assistant_person("bob", "Bob", 1000.0)
        result = s.erase_subject("alice", retrain=False)
        assert result.home_assistant_opt_in is True
        assert list(s.store.home_assistant_people()) == ["bob"]
    finally:
        s.close()
