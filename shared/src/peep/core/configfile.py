"""The pydantic-free half of loading a configuration file, shared by ``peep-edge`` and ``peep``.

Each process validates its own typed model (pydantic v2, ``extra="forbid"``;
core does not import pydantic). Around that model both do the same
things, here:

- :func:`read_toml` reads the file; :class:`ConfigFileError` names the file
  and says what was expected. :func:`to_toml` writes one (tools and tests).
- :func:`resolve_path` resolves a relative path against the config file's
  directory, which the loaders pass to pydantic as validation context under
  :data:`BASE_DIR` (:func:`context_base_dir` reads it back).
- :func:`problems_from_errors` turns pydantic's error list
  (``ValidationError.errors()``, plain dicts) into :class:`Problem` tuples
  that print as ``key.path: expected ..., received ...``.
- :func:`clean_secret` checks a secret read from the environment or a file
  (one trailing newline removed; control characters refused, and for a
  token anything an HTTP/2 header cannot carry).

Standard library only.

Examples
--------
>>> resolve_path("bundle", "/etc/peep-edge")
PosixPath('/etc/peep-edge/bundle')
>>> resolve_path("/srv/bundle", "/etc/peep-edge")
PosixPath('/srv/bundle')
>>> errors = [
...     {"type": "greater_than", "loc": ("privacy", "epsilon"), "msg": "Input should be greater than 0", "input": 0},
...     {"type": "missing", "loc": ("bundle",), "msg": "Field required", "input": {}},
...     {"type": "extra_forbidden", "loc": ("grpc", "lisen"), "msg": "Extra inputs are not permitted", "input": "x"},
... ]
>>> for p in problems_from_errors(errors):
...     print(p)
privacy.epsilon: Input should be greater than 0, received 0
bundle: required setting is missing
grpc.lisen: unknown key (check the spelling), received 'x'
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "BASE_DIR",
    "NOT_GIVEN",
    "ConfigFileError",
    "Problem",
    "clean_secret",
    "context_base_dir",
    "problems_from_errors",
    "read_toml",
    "resolve_path",
    "to_toml",
]

#: Key of the validation context that holds the config file's directory.
BASE_DIR = "base_dir"
#: Longest ``repr`` of a received value shown in a problem (paths fit; blobs do not flood a terminal).
_MAX_SHOWN = 120


class _NotGiven:
    """The value of :attr:`Problem.received` when there is nothing to show."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()


class ConfigFileError(ValueError):
    """A configuration file could not be read or is not valid TOML.

    Parameters
    ----------
    path : Path
        The file.
    reason : str
        What was expected and what went wrong (``expected a readable TOML file (No such file or directory)``).
    """

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def read_toml(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Path]:
    """Read a TOML file; return its content and its (resolved) directory.

    Raises
    ------
    ConfigFileError
        The file is unreadable, not UTF-8 or not valid TOML (naming the file).
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigFileError(p, f"expected a readable TOML file ({exc.strerror})") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigFileError(p, f"expected valid TOML, parsing failed ({exc})") from None
    return data, p.resolve().parent


def to_toml(cfg: Mapping[str, Any]) -> str:
    """A configuration file's TOML text from a dict of sections (scalars, lists, sub-tables, arrays of tables).

    The reverse of :func:`read_toml`, for the tools that write a configuration (the bench, the demo, tests);
    ``None`` values are left out, as TOML has no null.

    >>> print(to_toml({"device": {"id": "cam-1", "port": 1883, "tls": True, "skip": None}}), end="")
    [device]
    id = "cam-1"
    port = 1883
    tls = true
    """

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        return json.dumps(str(v))

    lines: list[str] = []

    def table(name: str, data: Mapping[str, Any]) -> None:
        lines.append(f"[{name}]")
        for k, v in data.items():
            if v is not None and not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict)):
                lines.append(f"{k} = {scalar(v)}")
        for k, v in data.items():
            if isinstance(v, dict):
                table(f"{name}.{k}", v)
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    lines.append(f"[[{name}.{k}]]")
                    lines.extend(f"{ik} = {scalar(iv)}" for ik, iv in item.items() if iv is not None)

    for section, data in cfg.items():
        table(section, data)
    return "\n".join(lines) + "\n"


def resolve_path(value: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None) -> Path:
    """``~`` expanded; a relative path joined to ``base_dir`` (the config file's directory) when given."""
    p = Path(value).expanduser()
    if base_dir is not None and not p.is_absolute():
        p = Path(base_dir) / p
    return p


def context_base_dir(context: Mapping[str, Any] | None) -> Path | None:
    """The config file's directory from a validation context (``None`` when validating a mapping)."""
    base = (context or {}).get(BASE_DIR)
    return None if base is None else Path(base)


def _char_name(c: str) -> str:
    names = {"\n": "a line feed", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL"}
    return names.get(c, f"U+{ord(c):04X}")


def clean_secret(value: str, *, header_value: bool) -> str:
    """A secret as read from the environment or a file, checked before anything uses it.

    One trailing newline (``\\n`` or ``\\r\\n``: what ``echo``, ``printf '%s\\n'`` and
    most secret stores add) is removed; anything else that could not have been
    meant is refused with a :class:`ValueError` that says what and where, never
    the secret itself.

    Parameters
    ----------
    value : str
        The raw secret.
    header_value : bool
        The secret travels in an HTTP/2 header (a gRPC bearer token): only
        printable ASCII (``0x20``-``0x7E``), no leading or trailing space.
        Otherwise (a password) only control characters are refused.

    Examples
    --------
    >>> clean_secret("s3cret\\n", header_value=True)
    's3cret'
    >>> clean_secret("s3cret\\n\\n", header_value=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: expected a secret without control characters, found a line feed at position 7 of 7 (after ...
    >>> clean_secret("mot-de-passe-été", header_value=False)
    'mot-de-passe-été'
    """
    text = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    if not text:
        raise ValueError("expected a non-empty secret, received an empty one")
    n = len(text)
    for i, c in enumerate(text, start=1):
        if ord(c) < 0x20 or ord(c) == 0x7F:
            raise ValueError(
                f"expected a secret without control characters, found {_char_name(c)} at position {i} of {n} "
                "(after removing one trailing newline)"
            )
        if header_value and ord(c) > 0x7E:
            raise ValueError(
                f"expected a token of printable ASCII characters (it travels in an HTTP/2 header), found "
                f"{_char_name(c)} at position {i} of {n}"
            )
    if header_value and text != text.strip(" "):
        raise ValueError("expected a token without leading or trailing spaces (HTTP/2 header values cannot keep them)")
    return text


class Problem(NamedTuple):
    """One invalid setting: the dotted key path, what was expected, and the value received.

    A tuple ``(key, message, received)``; ``received`` is :data:`NOT_GIVEN` when
    there is nothing useful to show (a missing key, a whole section).
    """

    key: str
    message: str
    received: Any = NOT_GIVEN

    @property
    def detail(self) -> str:
        """``message, received <value>`` (or the message alone)."""
        if self.received is NOT_GIVEN:
            return self.message
        shown = repr(self.received)
        if len(shown) > _MAX_SHOWN:
            shown = shown[: _MAX_SHOWN - 3] + "..."
        return f"{self.message}, received {shown}"

    def __str__(self) -> str:
        return f"{self.key}: {self.detail}"


def _key(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "(root)"


def problems_from_errors(
    errors: Iterable[Mapping[str, Any]], *, unknown_key: str = "unknown key (check the spelling)"
) -> list[Problem]:
    """Turn pydantic's ``ValidationError.errors()`` into :class:`Problem` tuples.

    Parameters
    ----------
    errors : iterable of mapping
        Each with ``type``, ``loc``, ``msg`` and ``input`` (pydantic v2's error dicts).
    unknown_key : str
        The message for a key the model does not have (``extra="forbid"``).

    Returns
    -------
    list of Problem
        Keys like ``auth.devices[0].id``. A validator whose message starts with
        a dotted key (``privacy.delta: expected ...``) names the key itself;
        its message already says what it received.
    """
    problems: list[Problem] = []
    for err in errors:
        msg = str(err["msg"])
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        head, sep, rest = msg.partition(": ")
        if sep and "." in head and " " not in head:
            problems.append(Problem(head, rest))
            continue
        kind = err.get("type")
        if kind == "missing":
            problems.append(Problem(_key(err["loc"]), "required setting is missing"))
            continue
        if kind == "extra_forbidden":
            msg = unknown_key
        elif kind == "literal_error" and "expected" in (err.get("ctx") or {}):
            # pydantic says "Input should be 'a', 'b' or 'c'"; say it the way every other error does.
            msg = f"expected one of {err['ctx']['expected']}"
        value = err.get("input", NOT_GIVEN)
        # A whole section as "received" says nothing the key path does not.
        problems.append(Problem(_key(err["loc"]), msg, NOT_GIVEN if isinstance(value, dict) else value))
    return problems
