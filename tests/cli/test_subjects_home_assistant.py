"""``peep subjects home-assistant``: an enrolled subject opted in under a display name, renamed, listed, opted out;
refusals; each change and refusal in the console's audit log (without the display name)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from peep.server.cli import main
from peep.server.storage import TemplateRecord
from peep.server.storage.sqlite import SqliteStore
from peep_testing.server import base_config, to_toml


def _enrolment(subject: str, i: int) -> TemplateRecord:
    return TemplateRecord(
        message_id=f"m{i}", device_id="cam-1", site="lobby", bundle_id="eb-1", mechanism_kind="peep-raw", epsilon=8.0,
        delta=0.0, epsilon_coordinate=8.0, epsilon_vector=32.0, noise_std=0.1, purpose="enroll", subject=subject,
        track_id="t1", capture_time=1.0, received_at=2.0, n_components=4,
        values=np.zeros(4, dtype=np.float32).tobytes(),
    )  # fmt: skip


@pytest.fixture
def conf(tmp_path: Path, keypair) -> Path:
    cfg = base_config(tmp_path, keypair[3], None)
    cfg["auth"]["allow_insecure"] = True
    path = tmp_path / "server.toml"
    path.write_text(to_toml(cfg))
    store = SqliteStore(tmp_path / "peep.db")
    store.insert_templates([_enrolment("alice", 1), _enrolment("background:0001", 2)])
    store.close()
    return path


def _db(conf: Path):
    return SqliteStore(conf.parent / "peep.db")


def _audit(conf: Path) -> list[tuple[str, str, str, str]]:
    from peep.server.console.store import ConsoleStore

    store = _db(conf)
    try:
        entries = ConsoleStore(store).audit_log(action="home-assistant", limit=20)
    finally:
        store.close()
    return [(e.actor, e.target, e.outcome, e.address) for e in reversed(entries)]


def _people(conf: Path):
    store = _db(conf)
    try:
        return {s: p.display_name for s, p in store.home_assistant_people().items()}
    finally:
        store.close()


def test_opt_in_rename_list_and_opt_out(conf, capsys):
    ha = ["subjects", "home-assistant", "--config", str(conf)]
    assert main([*ha, "--list"]) == 0
    assert "nobody opted in" in capsys.readouterr().out  # off by default
    assert main([*ha, "--subject", "alice", "--opt-in", "--name", "Alice Liddell"]) == 0
    out = capsys.readouterr().out
    assert "opted in to Home Assistant as 'Alice Liddell'" in out and "home_assistant.enabled is false" in out
    assert _people(conf) == {"alice": "Alice Liddell"}
    assert main([*ha, "--subject", "alice", "--opt-in", "--name", "Alice"]) == 0
    assert "renamed" in capsys.readouterr().out and _people(conf) == {"alice": "Alice"}
    assert main([*ha, "--list"]) == 0
    assert capsys.readouterr().out.startswith("alice\tAlice\topted in ")
    assert main([*ha, "--subject", "alice", "--opt-out"]) == 0
    assert "no longer shown" in capsys.readouterr().out and _people(conf) == {}
    assert main([*ha, "--subject", "alice", "--opt-out"]) == 0
    assert "was not opted in" in capsys.readouterr().out
    assert _audit(conf) == [
        ("cli", "alice", "opted in", "local"),
        ("cli", "alice", "display name changed", "local"),
        ("cli", "alice", "opted out", "local"),
        ("cli", "alice", "opted out: was not opted in", "local"),
    ]
    # The audit log outlives an erasure: it never holds the name.
    assert not [a for a in _audit(conf) if "Alice" in " ".join(a)]


@pytest.mark.parametrize("subject", ["nobody", "background:0001"], ids=["not-enrolled", "background"])
def test_only_an_enrolled_subject_may_be_opted_in(conf, capsys, subject):
    code = main(["subjects", "home-assistant", "--config", str(conf), "--subject", subject, "--opt-in", "--name", "X"])
    assert code == 1 and "is not an enrolled subject" in capsys.readouterr().err
    assert _people(conf) == {} and _audit(conf) == [("cli", subject, "refused: not an enrolled subject", "local")]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--subject", "alice", "--opt-in"], "--name: expected the display name"),
        (["--subject", "alice", "--opt-in", "--name", "x" * 65], "--name: expected a display name of 1-64"),
        (["--subject", "alice", "--opt-in", "--name", "Al\u202eice"], "--name: expected a display name"),
        (["--subject", "a/b", "--opt-in", "--name", "A"], "--subject: expected"),
        (["--opt-in", "--name", "A"], "--subject: expected the subject's id"),
        (["--subject", "alice", "--opt-out", "--name", "A"], "--name: expected none with --opt-out"),
        (["--list", "--subject", "alice"], "--list: lists everyone"),
    ],
)
def test_usage_errors_exit_2_name_the_option_and_change_nothing(conf, capsys, extra, needle):
    assert main(["subjects", "home-assistant", "--config", str(conf), *extra]) == 2
    assert needle in capsys.readouterr().err
    assert _people(conf) == {}


def test_one_action_is_required(conf, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["subjects", "home-assistant", "--config", str(conf), "--subject", "alice", "--opt-in", "--opt-out"])
    assert exc.value.code == 2
