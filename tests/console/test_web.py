"""The console over real HTTPS (httpx against the running server): sessions, roles, CSRF, headers, throttling."""

from __future__ import annotations

import re
from typing import Any

import pytest
from peep_testing.console import PASSWORDS, keeping, login_token

PAGES = ["/", "/live", "/devices", "/people", "/models", "/privacy", "/home-assistant", "/audit", "/enrol", "/password"]
ENDPOINTS = ["/live/events", "/models/status"]
#: Every state-changing route, with a form that would be valid apart from the CSRF token.
POSTS = {
    "/logout": {},
    "/password": {"current": "x", "new": "y" * 12, "again": "y" * 12},
    "/alerts/ack": {"event_id": "abc"},
    "/people/erase": {"subject": "alice", "confirm": "alice"},
    "/people/home-assistant": {"subject": "alice", "action": "opt-in", "name": "Alice", "agreed": "yes"},
    "/models/train": {},
    "/models/current": {"version": "v000001"},
    "/enrol": {"device": "cam-1", "track": "t", "subject": "alice"},
}


@pytest.mark.parametrize("path", PAGES)
def test_a_page_without_a_session_redirects_to_login(console, path):
    with console.client() as c:
        r = c.get(path)
    assert r.status_code == 303 and r.headers["location"] == "/login"


@pytest.mark.parametrize("path", ENDPOINTS)
def test_an_endpoint_without_a_session_answers_401(console, path):
    with console.client() as c:
        r = c.get(path)
    assert r.status_code == 401


@pytest.mark.parametrize("path", sorted(POSTS))
def test_a_post_without_a_session_answers_401(console, path):
    with console.client() as c:
        r = c.post(path, data={**POSTS[path], "csrf": "x"})
    assert r.status_code == 401


@pytest.mark.parametrize("path", sorted(POSTS))
@pytest.mark.parametrize("token", [None, "", "forged-token"])
def test_every_state_change_requires_the_sessions_csrf_token(console, path, token):
    with console.login("root") as c:
        form = dict(POSTS[path])
        if token is not None:
            form["csrf"] = token
        r = c.post(path, data=form)
        assert r.status_code == 403, (path, r.status_code, r.text[:200])
        assert "csrf" in r.text
        # the session is still there: the refusal changed nothing
        assert c.get("/live").status_code == 200


def test_login_requires_its_form_token(console):
    with console.client() as c:
        r = c.post("/login", data={"name": "root", "password": PASSWORDS["root"], "csrf": "guess"})
        assert r.status_code == 403
        token = login_token(c)
        r = c.post("/login", data={"name": "root", "password": PASSWORDS["root"], "csrf": token})
        assert r.status_code == 303


def test_a_foreign_origin_is_refused_even_with_the_token(console):
    with console.login("root") as c:
        r = c.post("/models/train", data={"csrf": c.csrf}, headers={"origin": "https://evil.example"})
    assert r.status_code == 403 and "origin" in r.text


def test_session_cookie_is_secure_httponly_samesite_strict(console):
    with console.client() as c:
        token = login_token(c)
        r = c.post("/login", data={"name": "olga", "password": PASSWORDS["olga"], "csrf": token})
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("__Host-peep_session=")
    low = cookie.lower()
    assert "secure" in low and "httponly" in low and "samesite=strict" in low and "path=/" in low


def test_every_response_carries_a_strict_csp(console):
    with console.client() as c:
        for path in ("/login", "/static/console.js", "/live"):
            r = c.get(path)
            csp = r.headers["content-security-policy"]
            assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
            assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
        assert "<script>" not in c.get("/login").text.replace('<script src="/static/console.js" defer></script>', "")


@pytest.mark.parametrize(
    ("path", "form"),
    [
        ("/people/erase", {"subject": "alice", "confirm": "alice"}),
        ("/models/train", {}),
        ("/models/current", {"version": "v000001"}),
    ],
)
def test_an_operator_cannot_erase_or_train(console, path, form):
    with console.login("olga") as c:
        r = c.post(path, data={**form, "csrf": c.csrf})
        assert r.status_code == 403
        assert "may not" in r.text
        people = c.get("/people").text
    assert "alice" in people  # not erased
    assert not console.server.services.trainer.training
    with console.login("root") as admin:
        log = admin.get("/audit").text
    assert "denied:" in log and "olga" in log


def test_erasing_a_subject_nothing_holds_changes_nothing(console):
    """People: an id no template, trait, decision or model names is refused with 404, however often it is
    asked, and trains no version: identical retrained models would push the roll-back versions out."""
    services = console.server.services
    console_store = console.server.app.console.console.store
    version, kept = services.recogniser.model.version, services.registry.versions()
    ghost = "nobody-ever-enrolled"
    with console.login("root") as c:
        for _ in range(3):
            r = c.post("/people/erase", data={"subject": ghost, "confirm": ghost, "csrf": c.csrf})
            assert r.status_code == 404, r.text[:500]
            assert f"subject: no such subject &#39;{ghost}&#39;" in r.text and 'id="erase-result"' not in r.text
    assert services.recogniser.model.version == version and services.registry.versions() == kept
    assert ghost not in services.store.erasures()
    refusals = [e for e in console_store.audit_log(action="erase") if e.target == ghost]
    assert [e.outcome for e in refusals] == ["refused: no such subject"] * 3


def test_an_operator_sees_no_erase_or_train_controls(console):
    with console.login("olga") as c:
        assert 'action="/people/erase"' not in c.get("/people").text
        assert 'action="/models/train"' not in c.get("/models").text
        assert c.get("/audit").status_code == 403


def test_the_enrolment_desk_can_only_enrol(console):
    with console.login("desk") as c:
        for path in ("/live", "/devices", "/people", "/models", "/privacy", "/audit"):
            assert c.get(path).status_code == 403, path
        assert c.get("/live/events").status_code == 403
        assert c.get("/enrol").status_code == 200


def test_nothing_to_enrol_from_a_camera_when_templates_are_forgotten(console):
    from peep_testing.server import DEVICE

    stub = console.server.stub()
    for m in [console.faces.message(2, purpose="identify", track_id="forgotten-track") for _ in range(2)]:
        stub.Ingest(m, metadata=DEVICE, timeout=10)
    with console.login("desk") as c:
        page = c.get("/enrol").text
        assert "forgotten-track" not in page and 'id="keep-note"' in page and "peep-edge enroll" in page
        r = c.post("/enrol", data={"device": "cam-1", "track": "forgotten-track", "subject": "carol", "csrf": c.csrf})
        assert r.status_code == 404 and "no templates of device cam-1 track forgotten-track" in r.text


def test_people_and_privacy_pages_show_what_is_kept_per_category(console):
    store = console.server.services.store
    k = store.kept_counts(console.server.services.config.training.background_prefix)
    with console.login("root") as c:
        for path in ("/people", "/privacy"):
            page = c.get(path).text
            assert 'id="kept"' in page and 'id="keep-none"' in page and 'id="keep-all"' not in page
            row = re.search(r'<tr id="kept-unknown">.*?<td class="n">(\d+)</td>', page, re.S)
            assert row is not None and int(row.group(1)) == k.unknown == 0
            row = re.search(r'<tr id="kept-enrolment">.*?<td class="n">(\d+)</td>', page, re.S)
            assert row is not None and int(row.group(1)) == k.enrolment > 0
            assert "not kept (recognition.keep = none)" in page
        with keeping(console, "all"):
            page = c.get("/privacy").text
            assert 'id="keep-all"' in page and "people who never enrolled" in page


def test_enrolment_desk_enrols_a_track(console):
    from peep_testing.server import DEVICE

    stub = console.server.stub()
    msgs = [console.faces.message(2, purpose="identify", track_id="desk-track-1") for _ in range(3)]
    with keeping(console, "all"):  # enrolling a camera's track needs its templates kept
        for m in msgs:
            stub.Ingest(m, metadata=DEVICE, timeout=10)
    with console.login("desk") as c:
        assert "desk-track-1" in c.get("/enrol").text
        r = c.post("/enrol", data={"device": "cam-1", "track": "desk-track-1", "subject": "carol", "csrf": c.csrf})
        assert r.status_code == 200 and "3 templates" in r.text
        r = c.post("/enrol", data={"device": "cam-1", "track": "desk-track-1", "subject": "bad/id", "csrf": c.csrf})
        assert r.status_code == 400 and "subject: expected" in r.text


def test_only_the_admin_enrols_a_track_into_the_background(console):
    from peep_testing.server import DEVICE

    stub = console.server.stub()
    with keeping(console, "all"):
        for m in [console.faces.message(3, purpose="identify", track_id="desk-track-bg") for _ in range(2)]:
            stub.Ingest(m, metadata=DEVICE, timeout=10)
    form = {"device": "cam-1", "track": "desk-track-bg", "subject": "background:zed"}
    with console.login("desk") as c:
        r = c.post("/enrol", data={**form, "csrf": c.csrf})
        assert r.status_code == 403 and "only an admin enrols them" in r.text
    store = console.server.services.store
    assert store.count_templates(subject="background:zed") == 0
    with console.login("root") as c:
        assert "refused: background subject needs the admin role" in c.get("/audit").text
        r = c.post("/enrol", data={**form, "csrf": c.csrf})
        assert r.status_code == 200 and "2 templates" in r.text
    assert store.count_templates(subject="background:zed") == 2


def test_login_is_throttled_after_failures_even_with_the_right_password(console):
    with console.client() as c:
        for _ in range(5):
            r = c.post("/login", data={"name": "desk", "password": "wrong", "csrf": login_token(c)})
            assert r.status_code == 401
        r = c.post("/login", data={"name": "desk", "password": PASSWORDS["desk"], "csrf": login_token(c)})
        assert r.status_code == 429 and "too many failed logins" in r.text
    console.server.app.console.console.throttle.clear()  # other tests log in as desk


def test_forms_are_bounded(console):
    with console.login("root") as c:
        r = c.post(
            "/models/train",
            content=b"csrf=" + b"x" * 20_000,
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert r.status_code == 413


def test_a_one_time_password_must_be_changed_first(console):
    from peep.server.console.accounts import create_account
    from peep.server.console.store import ConsoleStore

    otp = create_account(ConsoleStore(console.server.services.store), "newbie", "operator")
    with console.client() as c:
        r = c.post("/login", data={"name": "newbie", "password": otp, "csrf": login_token(c)})
        assert r.status_code == 303 and r.headers["location"] == "/password"
        assert c.get("/live").headers["location"] == "/password"
        token = login_token(c) and __import__("peep_testing.console", fromlist=["csrf_of"]).csrf_of("/password", c)
        r = c.post("/password", data={"current": otp, "new": "short", "again": "short", "csrf": token})
        assert r.status_code == 400 and "12-256" in r.text
        new = "a-much-better-password"
        r = c.post("/password", data={"current": otp, "new": new, "again": new, "csrf": token})
        assert r.status_code == 303
        assert c.get("/live").status_code == 303  # sessions ended: log in again
        r = c.post("/login", data={"name": "newbie", "password": new, "csrf": login_token(c)})
        assert r.status_code == 303 and r.headers["location"] == "/"
        assert c.get("/live").status_code == 200


@pytest.mark.slow
def test_a_weak_new_password_is_refused_with_the_reason(console):
    """/password: common, keyboard, repetitive and name-based passwords are refused (400) with the strength
    estimator's reason, never echoed; the page says what is required; a long passphrase is accepted."""
    from peep.server.console.accounts import create_account
    from peep.server.console.store import ConsoleStore
    from peep_testing.console import csrf_of

    otp = create_account(ConsoleStore(console.server.services.store), "chooser", "operator")
    with console.client() as c:
        r = c.post("/login", data={"name": "chooser", "password": otp, "csrf": login_token(c)})
        assert r.status_code == 303 and r.headers["location"] == "/password"
        page = c.get("/password").text
        assert "12–256 characters, hard to guess" in page and "your account name" in page
        token = csrf_of("/password", c)
        for weak, reason in [
            ("aaaaaaaaaaaa", "Repeats like &#34;aaa&#34; are easy to guess."),
            ("password1234", "This is a very common password."),
            ("qwertyuiop12", "This is similar to a commonly used password."),
            ("chooserchooser", "Repeats like &#34;abcabcabc&#34;"),
        ]:
            r = c.post("/password", data={"current": otp, "new": weak, "again": weak, "csrf": token})
            assert r.status_code == 400, weak
            error = re.search(r'<p class="error" id="error">(.*?)</p>', r.text, re.S)
            assert error is not None, r.text[:2000]
            assert error.group(1).startswith("new password: expected one hard to guess (strength 3 of 4 or more), ")
            assert reason in error.group(1) and weak not in error.group(1), (weak, error.group(1))
        # What the estimator lets through but spraying lists try first; the site's name comes from the config.
        for sprayed, pattern in [
            ("Summer2026!!", "a season with a year"),
            ("Winter2025!!", "a season with a year"),
            ("Welcome2026!!", "a greeting with a year"),
            ("Lobby2026!!!", "a name with a year"),
        ]:
            r = c.post("/password", data={"current": otp, "new": sprayed, "again": sprayed, "csrf": token})
            assert r.status_code == 400, sprayed
            error = re.search(r'<p class="error" id="error">(.*?)</p>', r.text, re.S)
            assert error is not None, r.text[:2000]
            assert error.group(1).startswith("new password: expected more than a season, month, weekday, holiday")
            assert error.group(1).endswith(f"; received {pattern}") and "202" not in error.group(1), error.group(1)
        strong = "ochre lantern tundra whistle marmalade"
        r = c.post("/password", data={"current": otp, "new": strong, "again": strong, "csrf": token})
        assert r.status_code == 303
        r = c.post("/login", data={"name": "chooser", "password": strong, "csrf": login_token(c)})
        assert r.status_code == 303 and r.headers["location"] == "/"


def test_an_admin_rolls_back_to_a_kept_version_and_forward_again(console, monkeypatch):
    """Models: 'Serve' on an older version makes it the one identify uses; the refusal of a version that
    is not kept names it; the roll-back is in the audit log.

    The server is shared by every console module on this worker: the fixture's own version serves again
    afterwards, since the version trained here also learnt what earlier tests enrolled (a track as background,
    say) and may name the browser tests' stranger or miss their subjects."""
    services = console.server.services
    found = services.recogniser.model.version
    services.train()  # a second version, so there is one to roll back to
    newest = services.recogniser.model.version
    older = sorted(services.registry.versions())[-2]
    try:
        with console.login("root") as c:
            page = c.get("/models").text
            assert f'data-version="{older}"' in page and f'data-version="{newest}"' not in page  # serving: no button
            r = c.post("/models/current", data={"version": older, "csrf": c.csrf})
            assert r.status_code == 200 and f"{older} is serving" in r.text
            assert services.recogniser.model.version == older
            stub = console.server.stub()
            from peep.v1 import recognition_pb2
            from peep_testing.server import DEVICE

            resp = stub.Identify(recognition_pb2.IdentifyRequest(template=console.faces.message(0)), metadata=DEVICE,
                                 timeout=10)  # fmt: skip
            assert resp.model_version == older
            r = c.post("/models/current", data={"version": "v999999", "csrf": c.csrf})
            assert r.status_code == 409 and "no version &#39;v999999&#39; is kept" in r.text
            assert services.recogniser.model.version == older
            log = c.get("/audit").text
            assert "make-current" in log and older in log
            r = c.post("/models/current", data={"version": newest, "csrf": c.csrf})  # and forward again
            assert r.status_code == 200 and services.recogniser.model.version == newest
            # A version that knows a subject erased after it was trained is never served again.
            known = services.registry.get(older).meta["classes"]
            erased = {next(k for k in known if k): float(__import__("time").time()) + 1e6}
            monkeypatch.setattr(services.store, "erasures", lambda: erased)
            r = c.post("/models/current", data={"version": older, "csrf": c.csrf})
            assert r.status_code == 409 and "subjects were erased" in r.text
            assert services.recogniser.model.version == newest
    finally:
        monkeypatch.undo()
        services.make_current(found)
    assert services.recogniser.model.version == found


def test_devices_shows_what_a_device_reports_escaped(console, monkeypatch):
    """Devices: suppressed releases and the budgets of a device's own configuration, from its report; a
    device without one shows a dash."""
    import re

    from peep.core.reports import parse_device_report

    report = parse_device_report(
        b'{"v":1,"at":1795694855.0,"bundle_id":"eb-1","mechanism":"privunit","epsilon_vector":16.0,'
        b'"epsilon_coordinate":16.0,"epsilon_vector_per_release":18.0,"track_budget_vector":36.0,'
        b'"device_budget_vector":null,"releases":120,"epsilon_vector_spent":2160.0,'
        b'"suppressed":{"rate":40,"budget":3}}'
    )
    app = console.server.app.console.console
    monkeypatch.setattr(app, "device_reports", lambda: {"cam-1": (report, 1795694856.0)})
    with console.login("olga") as c:
        page = c.get("/devices").text
    row = re.search(r"<tr>\s*<td>cam-1</td>.*?</tr>", page, re.S)
    assert row, page[:2000]
    assert "43 (budget 3, rate 40)" in row.group(0) and "of 163 ready" in row.group(0)
    assert "36" in row.group(0) and "none" in row.group(0) and "18" in row.group(0)


def test_a_session_may_hold_only_a_few_live_streams(console):
    """Each Live event stream polls the feed: one account cannot pile them up (429), and a closed one frees
    its place."""
    import time
    from contextlib import ExitStack

    from peep.server.console.http import MAX_STREAMS_PER_SESSION

    def status_of_a_new_stream(c) -> int:
        with c.stream("GET", "/live/events") as r:
            return int(r.status_code)

    with console.login("olga") as c, ExitStack() as open_streams:
        streams = [open_streams.enter_context(c.stream("GET", "/live/events")) for _ in range(MAX_STREAMS_PER_SESSION)]
        assert all(r.status_code == 200 for r in streams)
        chunks = streams[0].iter_raw()  # kept: a dropped iterator closes its response, and so the stream
        assert next(chunks).startswith(b"retry:")
        r = c.get("/live/events")
        assert r.status_code == 429 and "at most" in r.text
        streams[0].close()
        deadline = time.monotonic() + 10
        while (code := status_of_a_new_stream(c)) == 429 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert code == 200


def test_a_doors_verification_shows_as_a_door_claim_on_live(console):
    """A door's VERIFY release carries a ``door-…`` track: Live names it a door claim, with the door's device."""
    import time

    from peep.v1 import recognition_pb2
    from peep_testing.server import DEVICE

    track = "door-" + "ab12cd34ef56"
    msg = console.faces.message(1, purpose="verify", subject="bob", track_id=track)
    resp = console.server.stub().Verify(recognition_pb2.VerifyRequest(template=msg, claimed_subject="bob"),
                                        metadata=DEVICE, timeout=10)  # fmt: skip
    with console.login("olga") as c:
        deadline = time.monotonic() + 10
        while track not in (page := c.get("/live?period=all").text) and time.monotonic() < deadline:
            time.sleep(0.1)
        row = next(r for r in page.split("<tr") if track in r)
        assert "verify (door claim)" in row and "cam-1" in row
        assert ("(accepted)" if resp.accepted else "(refused)") in row


def test_a_door_opened_from_home_assistant_shows_on_live_as_asked_from_afar_naming_nobody(console):
    """The door's record of an opening Home Assistant asked for: Live names who asked, not a subject."""
    import time

    from peep.core import wire
    from peep.v1 import recognition_pb2
    from peep_testing.server import DEVICE, SITE

    msg = wire.make_decision(device_id="cam-1", site=SITE, bundle_id=console.faces.bundle.bundle_id, key_id="",
                             model_serial=0, model_version="", purpose="verify", accepted=True,
                             requested_by="home_assistant", track_id="door-0123456789ab")  # fmt: skip
    ack = console.server.stub().Ingest(msg, metadata=DEVICE, timeout=10)
    assert ack.status == recognition_pb2.INGEST_STATUS_ACCEPTED, ack.reason
    with console.login("olga") as c:
        deadline = time.monotonic() + 10
        while "door-0123456789ab" not in (page := c.get("/live?period=all").text) and time.monotonic() < deadline:
            time.sleep(0.1)
        row = next(r for r in page.split("<tr") if "door-0123456789ab" in r)
        assert "verify (door, asked from afar)" in row and "opened at home assistant's request" in row
        assert "(door claim)" not in row


def test_a_database_away_answers_503_try_again_without_the_drivers_words(console, monkeypatch):
    """The database restarting: a page says to try again (503, Retry-After), never a 500 nor the DSN it failed on."""
    import psycopg
    from peep.server.storage.interface import StoreError

    app = console.server.app.console.console
    with console.login("olga") as c:
        assert c.get("/devices").status_code == 200
        for exc in (StoreError("storage.dsn 'postgresql://peep:hunter2@db': could not connect to PostgreSQL"),
                    psycopg.OperationalError("server closed the connection unexpectedly (hunter2)")):  # fmt: skip

            def away(*_a: Any, exc: Exception = exc, **_k: Any) -> Any:
                raise exc

            monkeypatch.setattr(app.store, "session", away)
            for path in ("/live", "/devices"):
                r = c.get(path)
                assert r.status_code == 503 and r.headers["retry-after"] == "5", (path, r.status_code)
                assert "try again" in r.text and "hunter2" not in r.text and "postgresql://" not in r.text
            assert c.get("/models/status").status_code == 503  # an API call: the same answer as text
        monkeypatch.undo()
        assert c.get("/devices").status_code == 200  # back as soon as the database is


def test_an_error_that_is_not_the_database_is_not_dressed_up_as_one(console, monkeypatch):
    app = console.server.app.console.console

    def broken(*_a: Any, **_k: Any) -> Any:
        raise KeyError("a bug, not an outage")

    with console.login("olga") as c:
        monkeypatch.setattr(app.store, "session", broken)
        assert c.get("/devices").status_code == 500
