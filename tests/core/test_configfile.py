"""The shared, pydantic-free half of config loading: TOML reading, path resolution, error wording."""

from __future__ import annotations

from pathlib import Path

import pytest
from peep.core.configfile import (
    BASE_DIR,
    NOT_GIVEN,
    ConfigFileError,
    Problem,
    context_base_dir,
    problems_from_errors,
    read_toml,
    resolve_path,
)


def test_read_toml_returns_the_data_and_the_files_directory(tmp_path):
    p = tmp_path / "a.toml"
    p.write_text('[mqtt]\ntopic_prefix = "x/y"\n')
    data, base = read_toml(p)
    assert data == {"mqtt": {"topic_prefix": "x/y"}} and base == tmp_path.resolve()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "expected a readable TOML file (No such file or directory)"),
        (b"[device\nid = 1", "expected valid TOML, parsing failed ("),
        (b"\xff\xfe", "expected valid TOML, parsing failed ("),
    ],
)
def test_read_toml_errors_name_the_file_and_the_expectation(tmp_path, content, fragment):
    p = tmp_path / "edge.toml"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(ConfigFileError) as info:
        read_toml(p)
    assert info.value.path == p and fragment in info.value.reason
    assert str(info.value).startswith(f"{p}: expected")


def test_relative_paths_resolve_against_the_config_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_path("keys/site.pub", tmp_path) == tmp_path / "keys" / "site.pub"
    assert resolve_path("/abs/site.pub", tmp_path) == Path("/abs/site.pub")
    assert resolve_path("~/site.pub", tmp_path) == tmp_path / "home" / "site.pub"
    assert resolve_path("keys/site.pub", None) == Path("keys/site.pub")
    assert context_base_dir({BASE_DIR: str(tmp_path)}) == tmp_path
    assert context_base_dir(None) is None and context_base_dir({BASE_DIR: None}) is None


def _err(kind, loc, msg, value=NOT_GIVEN):
    e = {"type": kind, "loc": loc, "msg": msg}
    if value is not NOT_GIVEN:
        e["input"] = value
    return e


def test_problems_read_key_path_expectation_received():
    got = problems_from_errors(
        [
            _err("less_than_equal", ("mqtt", "port"), "Input should be less than or equal to 65535", 70000),
            _err("value_error", ("auth", "devices", 0, "id"), "Value error, expected 1-128 characters", "bad/id"),
            _err("value_error", ("privacy",), "Value error, privacy.delta: expected 0, received 1e-05", {"a": 1}),
            _err("value_error", (), "Value error, grpc.tls is missing: set grpc.tls.cert/key", {"grpc": {}}),
            _err("missing", ("bundle",), "Field required", {}),
            _err("extra_forbidden", ("privacy", "seed"), "Extra inputs are not permitted", 7),
            _err("string_type", ("device", "id"), "Input should be a valid string", "x" * 500),
        ],
        unknown_key="unknown key (no seeds)",
    )
    assert [str(p) for p in got[:6]] == [
        "mqtt.port: Input should be less than or equal to 65535, received 70000",
        "auth.devices[0].id: expected 1-128 characters, received 'bad/id'",
        "privacy.delta: expected 0, received 1e-05",  # the validator named its key and value itself
        "(root): grpc.tls is missing: set grpc.tls.cert/key",  # a whole section is never echoed
        "bundle: required setting is missing",
        "privacy.seed: unknown key (no seeds), received 7",
    ]
    long = str(got[6])
    assert long.endswith("...") and len(long) < 200
    assert got[4] == ("bundle", "required setting is missing", NOT_GIVEN)  # still a plain (key, message, value)


def test_a_problem_is_a_tuple_printed_as_key_message_received():
    p = Problem("qbbs.store_path", "expected a file path", None)
    assert tuple(p) == ("qbbs.store_path", "expected a file path", None)
    assert str(p) == "qbbs.store_path: expected a file path, received None"
    assert str(Problem("x", "y")) == "x: y"
