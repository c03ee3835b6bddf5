"""The soft-trait store's tables come from the storage migrations, in its own SQLite file and in the server's
database; files and databases where the store made them itself open unchanged."""

from __future__ import annotations

import sqlite3

import pytest
from peep.server.qbbs import QbbsConfig, QbbsModule
from peep.server.storage import StoreError

# What the store ran on every open of its file before the migrations made its tables.
BEFORE = """
CREATE TABLE IF NOT EXISTS qbbs_soft_traits (
    subject TEXT NOT NULL, trait TEXT NOT NULL, value REAL NOT NULL, enrolled_at REAL NOT NULL,
    PRIMARY KEY (subject, trait)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS qbbs_soft_traits_trait ON qbbs_soft_traits (trait, subject);
CREATE TABLE IF NOT EXISTS qbbs_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _module(tmp_path, name="qbbs.sqlite") -> QbbsModule:
    return QbbsModule(QbbsConfig(store_path=tmp_path / name, ledger_path=tmp_path / "ledger.jsonl"))


def _schema(path) -> tuple[list[int], set[str]]:
    con = sqlite3.connect(path)
    try:
        versions = [v for (v,) in con.execute("SELECT version FROM qbbs_schema ORDER BY version")]
        names = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
    finally:
        con.close()
    return versions, names


def test_a_new_file_is_migrated(tmp_path):
    module = _module(tmp_path)
    try:
        module.enrol("alice", {"age": 40.0})
        assert module.enrolled_traits("alice") == ["age"]
    finally:
        module.close()
    versions, names = _schema(tmp_path / "qbbs.sqlite")
    assert versions == [1]
    assert {"qbbs_soft_traits", "qbbs_soft_traits_trait", "qbbs_meta"} <= names


def test_a_file_the_store_made_itself_keeps_its_soft_traits(tmp_path):
    first = _module(tmp_path)  # fixes the query structure, as a deployment's first enrolment does
    first.enrol("alice", {"age": 40.0, "height": 170.0})
    first.close()
    con = sqlite3.connect(tmp_path / "qbbs.sqlite", isolation_level=None)
    con.execute("DROP TABLE qbbs_schema")  # as the file was before: its tables, no record of a migration
    con.executescript(BEFORE)
    con.close()
    again = _module(tmp_path)
    try:
        assert again.enrolled_traits("alice") == ["age", "height"] and again.n_subjects() == 1
    finally:
        again.close()
    assert _schema(tmp_path / "qbbs.sqlite")[0] == [1]


def test_a_file_of_a_newer_version_is_refused(tmp_path):
    _module(tmp_path).close()
    con = sqlite3.connect(tmp_path / "qbbs.sqlite", isolation_level=None)
    con.execute("INSERT INTO qbbs_schema (version, applied_at) VALUES (2, 0)")
    con.close()
    with pytest.raises(StoreError, match=r"qbbs.store_path .*: schema version 2 is newer than this software's 1"):
        _module(tmp_path)


def test_in_memory_the_store_is_migrated_too():
    module = QbbsModule(QbbsConfig())
    try:
        module.enrol("bob", {"gender": 1.0})
        assert module.enrolled_traits("bob") == ["gender"]
    finally:
        module.close()
