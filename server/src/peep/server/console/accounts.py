"""Console accounts: roles and what each may do, password hashing, one-time passwords, login throttling.

Pure Python (no web framework here), so the rules are testable on their own: the standard library, and
the strength estimator :mod:`zxcvbn` (pure Python, in the ``console`` extra) for new passwords.

A new password must be 12-256 characters, not the account name, and hard to guess: a score of at least
:data:`MIN_STRENGTH` of 0-4 by zxcvbn (dictionaries of common passwords, names and words; keyboard
patterns, repeats, sequences, dates; the account name, the console's own words, the sites' names and
:data:`SPRAY_WORDS`), the estimator's warning and suggestion given as the reason for a refusal. The
estimator scores ``Summer2026!!`` 3, yet a season, month or greeting, or the name of the product, a site
or the account, padded with a year and a symbol or two is what password-spraying lists try first: such a
password is refused too, saying which kind of word and padding it is made of (:func:`spray_pattern`).

Passwords are hashed with scrypt (RFC 7914, :func:`hashlib.scrypt`), a memory-hard KDF: ``N = 2**15``,
``r = 8``, ``p = 1`` (128·r·N = 32 MiB and about 0.1 s per hash on one core), a 16-byte random salt and
a 32-byte key, stored as ``scrypt$15$8$1$<salt>$<key>`` (base64) so stronger parameters can be adopted
later without breaking stored hashes. A login for an unknown account still computes one hash, so the
answer's timing does not tell which accounts exist.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
from collections.abc import Sequence
from typing import Any, Final, Literal

Role = Literal["admin", "operator", "enrol"]
ROLES: Final[tuple[Role, ...]] = ("admin", "operator", "enrol")

#: What each role may do. ``view``: the Live, Devices, People, Models and Privacy pages;
#: ``acknowledge``: unknown-face alerts; ``enrol``: the enrolment desk; ``erase``, ``train``: what they say
#: (the gRPC API's admin methods); ``manage``: the console's own audit log.
PERMISSIONS: Final[dict[Role, frozenset[str]]] = {
    "admin": frozenset({"view", "acknowledge", "enrol", "erase", "train", "manage"}),
    "operator": frozenset({"view", "acknowledge"}),
    "enrol": frozenset({"enrol"}),
}

SCRYPT_LOG2_N: Final = 15
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
_SALT_BYTES: Final = 16
_KEY_BYTES: Final = 32
#: Longest password accepted (a longer one is refused before hashing: scrypt's cost must not be the client's to set).
MAX_PASSWORD: Final = 256
MIN_PASSWORD: Final = 12
#: Least zxcvbn score (0-4) of a new password: 3, an estimated 10^8 guesses or more, is what zxcvbn calls
#: safely unguessable (moderate protection offline against a slow hash, which scrypt is).
MIN_STRENGTH: Final = 3
#: Words a guesser tries first against this console, besides the account name and the sites' names.
CONTEXT_WORDS: Final = ("peep", "console", "operator", "admin", "enrol")
#: The words password-spraying lists start from, by kind (the kind is what a refusal names). Seasons, months and
#: weekdays in the main European languages (English, German, French, Spanish, Italian, Portuguese, Dutch, Swedish,
#: Polish), with and without their accents: spraying lists are made per country.
SPRAY_WORDS: Final[dict[str, tuple[str, ...]]] = {
    "a season": (
        "spring", "summer", "autumn", "fall", "winter",
        "frühling", "fruehling", "fruhling", "sommer", "herbst",
        "printemps", "été", "ete", "automne", "hiver",
        "primavera", "verano", "otoño", "otono", "invierno", "estate", "autunno", "inverno", "verão", "verao",
        "outono", "lente", "voorjaar", "zomer", "herfst", "najaar", "vår", "sommar", "höst", "vinter",
        "wiosna", "lato", "jesień", "jesien", "zima",
    ),
    "a month": (
        "january", "february", "march", "april", "may", "june",
        "july", "august", "september", "october", "november", "december",
        "januar", "februar", "märz", "maerz", "marz", "mai", "juni", "juli", "oktober", "dezember",
        "janvier", "février", "fevrier", "mars", "avril", "juin", "juillet", "août", "aout", "septembre",
        "octobre", "novembre", "décembre", "decembre",
        "enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "setiembre",
        "octubre", "noviembre", "diciembre",
        "gennaio", "febbraio", "aprile", "maggio", "giugno", "luglio", "settembre", "ottobre", "dicembre",
        "janeiro", "fevereiro", "março", "marco", "maio", "junho", "julho", "setembro", "outubro", "novembro",
        "dezembro",
        "januari", "februari", "maart", "mei", "augustus",
        "styczeń", "styczen", "luty", "marzec", "kwiecień", "kwiecien", "maj", "czerwiec", "lipiec",
        "sierpień", "sierpien", "wrzesień", "wrzesien", "październik", "pazdziernik", "listopad", "grudzień",
        "grudzien",
    ),
    "a weekday": (
        "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
        "montag", "dienstag", "mittwoch", "donnerstag", "freitag", "samstag", "sonnabend", "sonntag",
        "lundi", "mardi", "mercredi", "jeudi", "vendredi", "samedi", "dimanche",
        "lunes", "martes", "miércoles", "miercoles", "jueves", "viernes", "sábado", "sabado", "domingo",
        "lunedì", "lunedi", "martedì", "martedi", "mercoledì", "mercoledi", "giovedì", "giovedi", "venerdì",
        "venerdi", "sabato", "domenica",
        "segunda", "terça", "terca", "quarta", "quinta", "sexta",
        "maandag", "dinsdag", "woensdag", "donderdag", "vrijdag", "zaterdag", "zondag",
        "måndag", "mandag", "tisdag", "onsdag", "torsdag", "fredag", "lördag", "lordag", "söndag", "sondag",
        "poniedziałek", "poniedzialek", "wtorek", "środa", "sroda", "czwartek", "piątek", "piatek", "sobota",
        "niedziela",
    ),
    "a holiday": (
        "christmas", "xmas", "easter", "halloween", "newyear", "weihnachten", "ostern", "noël", "noel",
        "pâques", "paques", "navidad", "pascua", "natale", "pasqua", "natal", "kerstmis", "pasen", "jul",
    ),
    "a greeting": ("welcome", "hello", "willkommen", "bienvenue", "bienvenido", "benvenuto", "hallo", "hola", "ciao"),
    "a common admin word": (
        "password", "passwort", "passwd", "pass", "motdepasse", "contraseña", "contrasena", "wachtwoord",
        "changeme", "change", "letmein", "default", "admin", "administrator", "root", "secret", "master",
        "login", "localhost", "local", "test", "guest", "system", "server", "access", "camera", "door",
        "security", "office", "company", "temp", "user", "iloveyou",
    ),
}  # fmt: skip
#: Keyboard rows (QWERTY, QWERTZ, AZERTY; letters and digits) and columns: any run of four or more keys along
#: one, either way, is :func:`spray_pattern`'s "a keyboard walk".
KEYBOARD_LINES: Final = (
    "1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm", "qwertzuiop", "yxcvbnm", "azertyuiop", "qsdfghjklm",
    "wxcvbn", "1qaz", "2wsx", "3edc", "4rfv", "5tgb", "6yhn", "7ujm", "qazwsxedcrfvtgbyhnujm",
    "1qaz2wsx3edc4rfv5tgb6yhn7ujm",
)  # fmt: skip
#: Most digits, symbols and spaces around such words that still make a spraying pattern (a year and a few
#: symbols); with more, the estimator alone decides.
MAX_SPRAY_PADDING: Final = 10
#: Characters that stand for letters in such words (zxcvbn's substitutions).
_LEET: Final = {
    "4": "a", "@": "a", "8": "b", "(": "c", "{": "c", "[": "c", "<": "c", "3": "e", "6": "g", "9": "g",
    "1": "il", "!": "i", "|": "il", "7": "lt", "0": "o", "$": "s", "5": "s", "+": "t", "%": "x", "2": "z",
}  # fmt: skip
_YEAR = re.compile(r"(?:19|20)\d\d")
#: Leading characters of a password the estimator reads: its time grows steeply with length (a second at
#: 72 characters, a minute at 256), and 64 characters that are hard to guess make a password that is.
_ESTIMATED_CHARS: Final = 64
#: Longest reason quoted from the estimator (its own fixed sentences, never the password).
_MAX_REASON: Final = 300
#: The reason given when the estimator has no warning or suggestion for a weak password.
_NO_ADVICE: Final = "Add another word or two. Uncommon words are better."
#: zxcvbn keeps the user inputs of a call in a module-level dictionary: one estimate at a time.
_ESTIMATOR_LOCK = threading.Lock()
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
NAME_EXPECTATION: Final = "1-64 characters [A-Za-z0-9_.@-] starting with a letter or digit"


def is_account_name(name: str) -> bool:
    """Whether ``name`` could name an account (looked up only then: a login never queries for arbitrary text)."""
    return bool(_NAME.match(name))


class AccountError(ValueError):
    """An account name, role or password that is not acceptable; the message names the field."""


def check_name(name: object, field: str = "name") -> str:
    """``name`` if it is a usable account name, else :class:`AccountError` naming ``field``.

    >>> check_name("alice")
    'alice'
    >>> check_name("<b>")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    peep.server.console.accounts.AccountError: name: expected 1-64 characters ..., received '<b>'
    """
    if not isinstance(name, str) or not _NAME.match(name):
        shown = name[:64] if isinstance(name, str) else type(name).__name__
        raise AccountError(f"{field}: expected {NAME_EXPECTATION}, received {shown!r}")
    return name


def check_role(role: object) -> Role:
    """``role`` if it is one of :data:`ROLES`, else :class:`AccountError`."""
    if role not in ROLES:
        shown = role[:64] if isinstance(role, str) else type(role).__name__
        raise AccountError(f"role: expected one of {', '.join(ROLES)}, received {shown!r}")
    return role


def check_new_password(password: str, *, name: str = "", sites: Sequence[str] = ()) -> str:
    """``password`` if it is acceptable as an account's new password, else :class:`AccountError`.

    Acceptable: :data:`MIN_PASSWORD`-:data:`MAX_PASSWORD` characters, not the account name ``name``, a
    strength of at least :data:`MIN_STRENGTH` by :func:`password_strength`, and not a spraying pattern
    (:func:`spray_pattern`). The error names the field and, for a weak password, gives the estimator's
    reason or the pattern's kind; it never quotes the password.

    Parameters
    ----------
    password : str
        The password the account chose.
    name : str, optional
        The account's name (refused as the password, and a word the estimator treats as guessable).
    sites : sequence of str, optional
        The deployment's site names (guessable words too).

    Returns
    -------
    str
        ``password``, unchanged.
    """
    if not MIN_PASSWORD <= len(password) <= MAX_PASSWORD:
        raise AccountError(
            f"password: expected {MIN_PASSWORD}-{MAX_PASSWORD} characters, received {len(password)} characters"
        )
    if name and password.lower() == name.lower():
        raise AccountError("password: expected something other than the account name")
    score, reason = password_strength(password, name=name, sites=sites)
    if score < MIN_STRENGTH:
        raise AccountError(
            f"password: expected one hard to guess (strength {MIN_STRENGTH} of 4 or more), "
            f"received one of strength {score}: {reason or _NO_ADVICE}"
        )
    pattern = spray_pattern(password, name=name, sites=sites)
    if pattern:
        raise AccountError(
            "password: expected more than a season, month, weekday, holiday, greeting, keyboard walk, common admin "
            "word or name (of this console, a site or the account) padded with digits and symbols, which "
            f"password-spraying lists try first; received {pattern}"
        )
    return password


def _own_words(name: str, sites: Sequence[str]) -> list[str]:
    """This console's, the sites' and the account's names, and the account name's parts."""
    return [*CONTEXT_WORDS, *sites, *([name, *re.split(r"[._@-]+", name)] if name else [])]


def _keyboard_walks() -> list[str]:
    """Every run of four or more keys along one of :data:`KEYBOARD_LINES`, forwards and backwards."""
    runs = {line[a:b] for line in KEYBOARD_LINES for a in range(len(line)) for b in range(a + 4, len(line) + 1)}
    return sorted(runs | {r[::-1] for r in runs})


def _guessable_words(name: str, sites: Sequence[str]) -> dict[str, list[str]]:
    """The words a spraying list starts from, by kind: :data:`SPRAY_WORDS`, keyboard walks, then ``a name``
    (each of :func:`_own_words`, each run of three or more letters in one, each of its parts between separators,
    and the whole with its separators removed: a site ``demo-89c7`` gives ``demo``, ``89c7`` and ``demo89c7``)."""
    own = _own_words(name, sites)
    names = {run.casefold() for w in own for run in re.findall(r"[^\W\d_]{3,}", w)}
    names |= {w.casefold() for w in own if len(w) >= 3}
    names |= {part.casefold() for w in own for part in re.split(r"[\W_]+", w) if len(part) >= 3}
    names |= {joined for w in own if len(joined := re.sub(r"[\W_]+", "", w).casefold()) >= 3}
    words = {kind: list(words) for kind, words in SPRAY_WORDS.items()}
    return {**words, "a keyboard walk": _keyboard_walks(), "a name": sorted(names)}


def spray_pattern(password: str, *, name: str = "", sites: Sequence[str] = ()) -> str:
    """What spraying pattern ``password`` is ('' for none): its letters are guessable words only.

    Guessable words are :data:`SPRAY_WORDS` and the console's, the sites' and the account's names (letters
    may be written as digits or symbols, ``Summ3r``); around them at most :data:`MAX_SPRAY_PADDING` digits,
    symbols and spaces. The answer names the kinds of word and of padding, never the password's text.

    >>> spray_pattern("Summer2026!!")
    'a season with a year'
    >>> spray_pattern("W3lcome-Lobby-7", sites=["lobby"])
    'a greeting and a name with digits or symbols'
    >>> spray_pattern("Qu4rtz-Summer-Fjord!")
    ''
    """
    text = password[:_ESTIMATED_CHARS].casefold()
    words = _guessable_words(name, sites)
    # best[i]: the kinds of word that cover text[:i] with the least padding (None: not coverable).
    best: list[tuple[int, frozenset[str]] | None] = [None] * (len(text) + 1)
    best[0] = (0, frozenset())
    for i in range(len(text)):
        here = best[i]
        if here is None:
            continue
        padding, kinds = here
        if not text[i].isalpha():
            _better(best, i + 1, (padding + 1, kinds))
        for kind, options in words.items():
            for word in options:
                if _spelt(text, i, word):
                    _better(best, i + len(word), (padding, kinds | {kind}))
    end = best[len(text)]
    if end is None or not end[1] or end[0] > MAX_SPRAY_PADDING:
        return ""
    found = [k for k in words if k in end[1]]
    rest = "".join(c for c in text if not c.isalpha())
    around = "a year" if _YEAR.search(rest) else "digits or symbols" if rest.strip() else ""
    return " and ".join(found) + (f" with {around}" if around else "")


def _better(best: list[tuple[int, frozenset[str]] | None], at: int, candidate: tuple[int, frozenset[str]]) -> None:
    current = best[at]
    if current is None or candidate[0] < current[0]:
        best[at] = candidate


def _spelt(text: str, at: int, word: str) -> bool:
    """Whether ``text[at:]`` begins with ``word``, letters or their stand-ins (:data:`_LEET`)."""
    if at + len(word) > len(text):
        return False
    return all(c == w or w in _LEET.get(c, "") for c, w in zip(text[at : at + len(word)], word, strict=True))


def password_strength(password: str, *, name: str = "", sites: Sequence[str] = ()) -> tuple[int, str]:
    """The zxcvbn score (0-4) of ``password`` and, when it is weak, why (the estimator's warning and advice).

    The account name, its parts, the sites' names, :data:`CONTEXT_WORDS` and :data:`SPRAY_WORDS` count as
    guessable words. Only the first :data:`_ESTIMATED_CHARS` characters are read.

    Parameters
    ----------
    password : str
    name : str, optional
        The account's name.
    sites : sequence of str, optional
        The deployment's site names.

    Returns
    -------
    tuple of (int, str)
        The score, and the reason ('' for a score of 3 or 4); at most :data:`_MAX_REASON` characters.
    """
    try:
        from zxcvbn import zxcvbn
    except ModuleNotFoundError as exc:  # no password is accepted unread
        raise RuntimeError(
            "password strength: expected the zxcvbn package (install peep-server[console]), received none"
        ) from exc
    words = [*_own_words(name, sites), *(w for kind in SPRAY_WORDS.values() for w in kind)]
    with _ESTIMATOR_LOCK:
        result = zxcvbn(password[:_ESTIMATED_CHARS], user_inputs=[w for w in words if w])
    feedback = result.get("feedback") or {}
    reason = " ".join(t for t in [feedback.get("warning") or "", *(feedback.get("suggestions") or [])] if t)
    if len(reason) > _MAX_REASON:
        reason = reason[: _MAX_REASON - 3] + "..."
    return int(result["score"]), reason


def allowed(role: str, action: str) -> bool:
    """Whether ``role`` may do ``action`` (:data:`PERMISSIONS`); an unknown role may do nothing."""
    return action in PERMISSIONS.get(role, frozenset())  # type: ignore[call-overload]


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """The stored form of ``password`` (see the module docstring for the parameters)."""
    if len(password) > MAX_PASSWORD:
        raise AccountError(f"password: expected at most {MAX_PASSWORD} characters, received {len(password)}")
    salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    key = _scrypt(password, salt, SCRYPT_LOG2_N, SCRYPT_R, SCRYPT_P)
    b64 = base64.b64encode
    return f"scrypt${SCRYPT_LOG2_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(key).decode()}"


def _scrypt(password: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    n = 1 << log2_n
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=_KEY_BYTES, maxmem=2 * 128 * r * n * p + (1 << 20)
    )


_DUMMY_HASH: str | None = None


def verify_password(password: str, stored: str | None) -> bool:
    """Whether ``password`` matches ``stored`` (constant-time compare; None: compute a hash anyway, answer False)."""
    global _DUMMY_HASH
    if len(password) > MAX_PASSWORD:
        return False
    if stored is None:
        if _DUMMY_HASH is None:
            _DUMMY_HASH = hash_password(secrets.token_urlsafe(16))
        stored, expected = _DUMMY_HASH, False
    else:
        expected = True
    try:
        kind, log2_n, r, p, salt, key = stored.split("$")
        if kind != "scrypt" or not (10 <= int(log2_n) <= 22) or not (1 <= int(r) <= 32) or not (1 <= int(p) <= 16):
            return False
        got = _scrypt(password, base64.b64decode(salt), int(log2_n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, base64.b64decode(key)) and expected


def one_time_password() -> str:
    """A random password to hand over once (about 120 bits; the account must change it at first login)."""
    return secrets.token_urlsafe(15)


def create_account(
    store: Any, name: str, role: str, *, field: str = "name", actor: str = "cli", address: str = "local"
) -> str:
    """Create ``name`` with ``role`` in ``store`` and a one-time password; returns the password (shown once).

    Accounts are created outside the web console only (``peep console add-user``, ``peep demo``): the account
    must choose its own password at first login, and only the password's hash is kept. The creation is written
    to the console's audit log as done by ``actor`` from ``address``.

    Parameters
    ----------
    store : ConsoleStore
    name, role : str
        Checked by :func:`check_name` (errors name ``field``) and :func:`check_role`.
    field : str
        How an error names the account name (``--name`` for the command line).
    actor, address : str
        Who created it, and from where, as the audit log records them.

    Raises
    ------
    ValueError
        An unusable name or role (:class:`AccountError`), or an account of that name exists.
    """
    check_name(name, field)
    check_role(role)
    password = one_time_password()
    store.add_account(name, role, hash_password(password), must_change=True)
    store.audit(actor, "add-user", name, f"role {role}", address)
    return password


def new_token() -> str:
    """A random session id or CSRF token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """What the database keeps of a session id: its SHA-256 (a read of the table does not yield sessions)."""
    return hashlib.sha256(token.encode("ascii", "replace")).hexdigest()


class Throttled(Exception):
    """Too many failed logins; ``retry_after`` seconds until the oldest one leaves the window."""

    def __init__(self, key: str, retry_after: float) -> None:
        self.key = key
        self.retry_after = retry_after
        super().__init__(f"too many failed logins for this {key}; try again in {int(retry_after) + 1} s")
