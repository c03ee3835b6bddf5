"""Accounts without a server: password hashing, roles, names, throttling, how untrusted text is shown."""

from __future__ import annotations

import pytest
from peep.server.console import accounts
from peep.server.console.accounts import AccountError
from peep.server.console.text import shown


def test_scrypt_hash_states_its_parameters_and_verifies():
    h = accounts.hash_password("correct horse battery")
    kind, log2_n, r, p, _salt, _key = h.split("$")
    assert (kind, int(log2_n), int(r), int(p)) == ("scrypt", 15, 8, 1)
    assert accounts.verify_password("correct horse battery", h)
    assert not accounts.verify_password("correct horse batterY", h)
    assert accounts.hash_password("correct horse battery") != h  # a fresh salt each time


@pytest.mark.parametrize("stored", [None, "", "md5$x", "scrypt$30$8$1$AA==$AA==", "scrypt$15$8$1$!!$!!"])
def test_unknown_or_malformed_hashes_never_verify(stored):
    assert not accounts.verify_password("anything", stored)


def test_overlong_passwords_are_refused_before_hashing():
    with pytest.raises(AccountError, match=r"^password: expected at most 256 characters, received 257$"):
        accounts.hash_password("x" * 257)
    assert not accounts.verify_password("x" * 257, accounts.hash_password("x" * 12))


@pytest.mark.parametrize(
    ("role", "action", "ok"),
    [
        ("admin", "erase", True), ("admin", "train", True), ("admin", "view", True), ("admin", "manage", True),
        ("operator", "view", True), ("operator", "acknowledge", True), ("operator", "erase", False),
        ("operator", "train", False), ("operator", "enrol", False), ("operator", "manage", False),
        ("enrol", "enrol", True), ("enrol", "view", False), ("enrol", "acknowledge", False), ("enrol", "erase", False),
        ("nobody", "view", False),
    ],
)  # fmt: skip
def test_roles(role, action, ok):
    assert accounts.allowed(role, action) is ok


@pytest.mark.parametrize("name", ["", "a" * 65, "<script>", "bob\u202e", "-x", "a b"])
def test_bad_account_names_are_refused_naming_the_field(name):
    with pytest.raises(AccountError, match=r"^--name: expected 1-64 characters"):
        accounts.check_name(name, "--name")


def test_new_passwords_are_bounded_and_not_the_name():
    with pytest.raises(AccountError, match=r"12-256 characters, received 5"):
        accounts.check_new_password("short")
    with pytest.raises(AccountError, match="other than the account name"):
        accounts.check_new_password("AliceAliceAlice", name="alicealicealice")


@pytest.mark.parametrize(
    ("password", "reason"),
    [
        ("aaaaaaaaaaaa", 'Repeats like "aaa" are easy to guess.'),
        ("password1234", "This is a very common password."),
        ("qwertyuiop12", "This is similar to a commonly used password."),
        ("alice.malice.m", 'Repeats like "abcabcabc"'),  # the account name repeated
        ("peep-console", "Add another word or two."),  # the console's own words
    ],
)
def test_weak_new_passwords_are_refused_with_the_estimators_reason(password, reason):
    with pytest.raises(AccountError, match=r"^password: expected one hard to guess \(strength 3 of 4 or more\), ") as e:
        accounts.check_new_password(password, name="alice.m")
    message = str(e.value)
    assert reason in message and password not in message and len(message) < 500


SPRAYING = (
    "password: expected more than a season, month, weekday, holiday, greeting, keyboard walk, common admin word or "
    "name (of this console, a site or the account) "
)


@pytest.mark.parametrize(
    ("password", "pattern"),
    [
        ("Summer2026!!", "a season with a year"),
        ("Winter2025!!", "a season with a year"),
        ("Welcome2026!!", "a greeting with a year"),
        ("October 2025 !!", "a month with a year"),
        ("Summ3r-2026!", "a season with a year"),  # letters written as digits
        ("Peep2026!!!!", "a name with a year"),  # the product
        ("Lobby2026!!!", "a name with a year"),  # a site
        ("Alice.M2026!!", "a name with a year"),  # the account
        ("Spring-2026-Peep", "a season and a name with a year"),
        ("hello-operator-##", "a greeting and a name with digits or symbols"),
    ],
)
def test_spraying_patterns_the_estimator_lets_through_are_refused_naming_the_pattern(password, pattern):
    score, _ = accounts.password_strength(password, name="alice.m", sites=["lobby"])
    assert score >= accounts.MIN_STRENGTH  # the estimator alone would take each of them
    with pytest.raises(AccountError) as e:
        accounts.check_new_password(password, name="alice.m", sites=["lobby"])
    message = str(e.value)
    assert message.startswith(SPRAYING) and message.endswith(f"; received {pattern}"), message
    assert password.lower() not in message.lower() and "2026" not in message and "2025" not in message


@pytest.mark.parametrize(
    ("password", "pattern"),
    [
        # The site id with its separators removed, or its parts, around a year or another listed word.
        ("Demo89c72026!", "a name with a year"),
        ("Demo_89c7_2026", "a name with a year"),
        ("demo89c7Summer", "a season and a name with digits or symbols"),
        ("Qwerty2026!!", "a keyboard walk with a year"),
        ("Changeme2026!", "a common admin word with a year"),
        ("Christmas2025!", "a holiday with a year"),
        ("Monday2026!!", "a weekday with a year"),
        ("Sommer2026!!", "a season with a year"),  # German
        ("Verano2026!!", "a season with a year"),  # Spanish
        ("Localhost2026!", "a common admin word with a year"),
        ("Septembre2026!", "a month with a year"),  # French
        ("Mittwoch-2026!", "a weekday with a year"),  # German
    ],
)
def test_site_ids_keyboard_walks_weekdays_and_european_seasons_are_spraying_patterns(password, pattern):
    """Each of these was accepted on a console of site ``demo-89c7``: the spraying words were English seasons,
    months and greetings and the site's runs of letters only. Where the estimator does not refuse one itself,
    the refusal names the pattern."""
    assert accounts.spray_pattern(password, name="alice.m", sites=["demo-89c7"]) == pattern
    with pytest.raises(AccountError) as e:
        accounts.check_new_password(password, name="alice.m", sites=["demo-89c7"])
    message = str(e.value)
    score, _ = accounts.password_strength(password, name="alice.m", sites=["demo-89c7"])
    if score >= accounts.MIN_STRENGTH:
        assert message.startswith(SPRAYING) and message.endswith(f"; received {pattern}"), message
    assert password.lower() not in message.lower() and "89c7" not in message


@pytest.mark.parametrize(
    "password",
    ["ochre lantern tundra whistle marmalade", "Qu4rtz-Summer-Fjord!", "Summer93847561029384!"],
    ids=["passphrase", "a-season-among-other-words", "a-season-and-much-padding"],
)
def test_a_strong_password_with_or_near_a_listed_word_is_accepted(password):
    assert accounts.check_new_password(password, name="alice.m", sites=["lobby"]) == password


def test_long_random_passphrases_and_one_time_passwords_are_accepted():
    import secrets
    import string
    import time

    assert accounts.check_new_password("ochre lantern tundra whistle marmalade", name="alice")
    assert accounts.check_new_password(accounts.one_time_password(), name="alice")
    # The estimator reads a bounded prefix: a full 256 characters would take it about a minute.
    longest = "".join(secrets.choice(string.printable[:94]) for _ in range(accounts.MAX_PASSWORD))
    t0 = time.monotonic()
    assert accounts.check_new_password(longest) == longest
    assert time.monotonic() - t0 < 10


def test_one_time_passwords_are_long_and_fresh():
    a, b = accounts.one_time_password(), accounts.one_time_password()
    assert a != b and len(a) >= 20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bob\u202eevil", "bob⟨U+202E⟩evil"),
        ("a\u2066b\u2069", "a⟨U+2066⟩b⟨U+2069⟩"),
        ("zero\u200bwidth", "zero⟨U+200B⟩width"),
        ("line\nbreak", "line⟨U+000A⟩break"),
        ("<script>", "<script>"),
        ("Zoë", "Zoë"),
    ],
)
def test_hidden_characters_are_shown_as_code_points(text, expected):
    assert shown(text) == expected


def test_shown_text_is_bounded():
    assert shown("x" * 1000) == "x" * 300 + "…"
