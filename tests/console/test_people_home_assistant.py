"""People: who is shown in Home Assistant, set by the role that may erase subjects, with the person's agreement and
the display name they agreed to; off by default, explained on the page, each change and refusal in the audit log
(never the name), refused for a role without the right."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def clean(console) -> Iterator[None]:
    """The session's console with nobody opted in, before and after (other tests share its database)."""
    store = console.server.services.store
    for subject in list(store.home_assistant_people()):
        store.clear_home_assistant_person(subject)
    yield
    for subject in list(store.home_assistant_people()):
        store.clear_home_assistant_person(subject)


def _form(c, **fields):
    return {"subject": "alice", "action": "opt-in", "name": "Alice Liddell", "agreed": "yes", "csrf": c.csrf, **fields}


def _audit(console, n):
    entries = console.server.app.console.console.store.audit_log(action="home-assistant", limit=n)
    return [(e.actor, e.target, e.outcome) for e in reversed(entries)]


def test_the_page_says_it_is_off_by_default_and_what_opting_in_publishes(console, clean):
    with console.login("root") as c:
        page = c.get("/people").text
    assert "Off by default" in page and "Nobody opted in." in page
    for needle in ("Last seen", "retained", "recorder", "empties both topics", "not the name"):
        assert needle in page
    assert "The integration is off" in page  # this server publishes no Home Assistant discovery
    # One opt-in form per listed subject; other tests in the session may have erased some, so count the store's.
    services = console.server.services
    prefix = services.config.training.background_prefix
    subjects = console.server.app.console.console.store.subjects()
    listed = [s for s, _, _ in subjects if not s.startswith(prefix)]
    assert listed and page.count('action="/people/home-assistant"') == len(listed)
    assert page.count("not shown") >= len(listed)


def test_an_admin_opts_a_subject_in_renames_and_opts_them_out(console, clean):
    store = console.server.services.store
    with console.login("root") as c:
        r = c.post("/people/home-assistant", data=_form(c))
        assert r.status_code == 200 and "alice is shown in Home Assistant as Alice Liddell" in r.text
        assert "shown as <strong>Alice Liddell</strong>" in r.text and 'value="opt-out"' in r.text
        assert {s: p.display_name for s, p in store.home_assistant_people().items()} == {"alice": "Alice Liddell"}
        r = c.post("/people/home-assistant", data=_form(c, name="<b>Al</b>"))
        assert r.status_code == 200 and "&lt;b&gt;Al&lt;/b&gt;" in r.text and "<b>Al</b>" not in r.text
        r = c.post("/people/home-assistant", data=_form(c, action="opt-out", name=""))
        assert r.status_code == 200 and "alice is no longer shown" in r.text
    assert store.home_assistant_people() == {}
    assert _audit(console, 3) == [
        ("root", "alice", "opted in"), ("root", "alice", "display name changed"), ("root", "alice", "opted out"),
    ]  # fmt: skip
    assert not [a for a in _audit(console, 3) if "Al" in a[2]]


@pytest.mark.parametrize(
    ("fields", "status", "error", "outcome"),
    [
        ({"agreed": ""}, 400, "agreed: expected the box ticked", "refused: agreement not confirmed"),
        ({"name": "x" * 65}, 400, "name: expected a display name of 1-64", "refused: invalid display name"),
        ({"name": "Al\u202eice"}, 400, "name: expected a display name", "refused: invalid display name"),
        ({"subject": "nobody"}, 404, "is not an enrolled subject", "refused: not an enrolled subject"),
        ({"subject": "background:0"}, 404, "is not an enrolled subject", "refused: not an enrolled subject"),
        ({"action": "publish"}, 400, "action: expected", "refused: no such action"),
    ],
    ids=["not-agreed", "long-name", "bidi-name", "not-enrolled", "background", "bad-action"],
)
def test_a_refused_opt_in_changes_nothing_and_is_in_the_audit_log(console, clean, fields, status, error, outcome):
    with console.login("root") as c:
        r = c.post("/people/home-assistant", data=_form(c, **fields))
    assert r.status_code == status and error in r.text
    assert console.server.services.store.home_assistant_people() == {}
    assert _audit(console, 1) == [("root", fields.get("subject", "alice"), outcome)]


def test_an_operator_may_not_opt_anyone_in_or_out_and_sees_no_control(console, clean):
    with console.login("olga") as c:
        page = c.get("/people").text
        assert 'action="/people/home-assistant"' not in page and "not shown" in page
        r = c.post("/people/home-assistant", data=_form(c))
        assert r.status_code == 403 and "may not" in r.text
    assert console.server.services.store.home_assistant_people() == {}
    entries = console.server.app.console.console.store.audit_log(action="denied:erase", limit=1)
    assert (entries[0].actor, entries[0].target) == ("olga", "/people/home-assistant")
