"""`peep erase` on the command line is in the console's audit log, refused or done, as the console's own erasures are.

A store of its own (a synthetic bundle's key, templates written directly) for the outcomes, and the session's
console for the Audit log page that shows them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from peep.server.cli import main
from peep_testing.server import base_config, tls_section, to_toml


def _server_toml(tmp: Path, public_key: Path, **sections: Any) -> Path:
    """A server.toml for the database and models under ``tmp`` (those of a server started there)."""
    path = tmp / "server.toml"
    path.write_text(to_toml(base_config(tmp, public_key, None, **sections)))
    return path


def _newest_erase(db: Path) -> Any:
    """The newest erase entry of the console's audit log in ``db``."""
    from peep.server.console.store import ConsoleStore
    from peep.server.storage.sqlite import SqliteStore

    store = SqliteStore(db)
    try:
        entries = ConsoleStore(store).audit_log(action="erase", limit=1)
    finally:
        store.close()
    assert entries, "no erase in the console's audit log"
    return entries[0]


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """A server.toml, its SQLite database and a releaser for templates (no server running)."""
    from peep.core.release import TemplateReleaser
    from peep.lab.bench.server import synthetic_bundle

    tmp = tmp_path_factory.mktemp("cli-audit")
    bundle, pub = synthetic_bundle(tmp)
    conf = _server_toml(tmp, pub, auth={"allow_insecure": True})
    return conf, tmp / "peep.db", (bundle, TemplateReleaser(bundle, kind="peep-raw", epsilon=8.0))


@pytest.mark.parametrize(
    ("subject", "code", "target", "outcome"),
    [
        ("nobody-at-all", 1, "nobody-at-all", "refused: no such subject"),
        ("a/b", 2, "a/b", "refused: invalid subject"),
        ("bob\u202eevil", 2, "bob\u202eevil", "refused: invalid subject"),
        ("y" * 5000, 2, "y" * 128, "refused: invalid subject"),  # the record is bounded, like the console's
    ],
    ids=["no-such-subject", "slash", "bidi-override", "overlong"],
)
def test_a_refused_erase_on_the_command_line_is_in_the_audit_log(alone, capsys, subject, code, target, outcome):
    conf, db, _ = alone
    assert main(["erase", "--config", str(conf), "--subject", subject]) == code
    err = capsys.readouterr().err
    assert ("--subject: expected" if code == 2 else "subject: no such subject") in err
    assert "audit log" not in err  # recorded, so nothing to say about it
    newest = _newest_erase(db)
    assert (newest.actor, newest.action, newest.target, newest.outcome, newest.address) == (
        "cli", "erase", target, outcome, "local",
    )  # fmt: skip


def test_an_erasure_on_the_command_line_is_in_the_audit_log_with_what_it_deleted(alone):
    import numpy as np
    from peep.core import wire
    from peep.server.storage import TemplateRecord
    from peep.server.storage.sqlite import SqliteStore

    conf, db, (bundle, releaser) = alone

    faces = np.random.default_rng(0).random((3, bundle.n_features), dtype=np.float32)
    store = SqliteStore(db)
    try:
        records = []
        for v in releaser.release(faces):
            msg = wire.make_template(
                v, device_id="cam-1", site="lobby", bundle_id=bundle.bundle_id, mechanism=releaser.description,
                purpose="enroll", subject="erin",
            )  # fmt: skip
            records.append(TemplateRecord.from_message(msg, v, received_at=time.time()))
        store.insert_templates(records)
    finally:
        store.close()
    assert main(["erase", "--config", str(conf), "--subject", "erin", "--no-retrain"]) == 0
    newest = _newest_erase(db)
    assert (newest.actor, newest.target, newest.address) == ("cli", "erin", "local")
    assert newest.outcome == "templates 3, soft traits 0, model -, purged -"


def test_the_console_shows_a_refused_command_line_erase(console):
    """On the Audit log page, as the console's own refusals are."""
    srv = console.server
    conf = _server_toml(srv.tmp, srv.app.config.bundle.public_key, grpc={"tls": tls_section(console.pki)})
    ghost = "nobody-asked-from-a-shell"
    assert main(["erase", "--config", str(conf), "--subject", ghost]) == 1
    with console.login("root") as admin:
        page = admin.get("/audit", params={"actor": "cli", "action": "erase"}).text
    row = next(r for r in page.split("<tr>") if ghost in r)
    assert "<td>cli</td>" in row and "refused: no such subject" in row and "<td>local</td>" in row
