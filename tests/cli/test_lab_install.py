"""`peep` with and without the lab: peep-lab's commands join through entry points; a serving install lists none
of them and says where a lab command comes from; a command that fails to load is an error, never left out."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from peep.server.cli import COMMANDS, LAB_INSTALL, added_commands

ROOT = Path(__file__).resolve().parents[2]
LAB_ENTRY_POINTS = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())["project"]["entry-points"][
    "peep.commands"
]


def _peep(*args: str, cwd: Path, block: tuple[str, ...] = (), no_lab: bool = False) -> subprocess.CompletedProcess[str]:
    """``peep ARGS`` in a fresh interpreter; ``block``: modules whose import fails; ``no_lab``: as a serving install
    (no distribution adds commands)."""
    code = (
        f"import sys, importlib.metadata as md; [sys.modules.__setitem__(m, None) for m in {block!r}];"
        f"ep = md.entry_points; md.entry_points = (lambda **kw: [] if {no_lab!r} and kw.get('group') == "
        "'peep.commands' else ep(**kw));"
        "from peep.server.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_the_lab_adds_the_commands_its_pyproject_declares_and_the_server_names_none():
    assert sorted(LAB_ENTRY_POINTS) == ["anonymize", "audit", "bench", "demo", "qbbs.evaluate", "sgap"]
    assert {ep.name for ep in added_commands()} == set(LAB_ENTRY_POINTS)
    assert not set(COMMANDS) & {n.partition(".")[0] for n in LAB_ENTRY_POINTS} - {"qbbs"}
    cli = (ROOT / "server" / "src" / "peep" / "server" / "cli.py").read_text()
    for name in ("audit", "anonymize", "sgap", "bench", "demo", "evaluate"):
        assert f'"{name}"' not in cli, f"peep-server's CLI names the lab command {name}"


def test_help_with_the_lab_lists_every_command(tmp_path):
    r = _peep("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    listed = {line.split()[0] for line in r.stdout.splitlines() if line.startswith("    ") and line.split()}
    assert {*COMMANDS, "audit", "anonymize", "bench", "demo", "sgap"} <= listed
    r = _peep("qbbs", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "evaluate" in r.stdout, r.stderr


@pytest.mark.parametrize(
    "args",
    [("audit", "--dataset", "lfw", "--out", "out"), ("-v", "demo"), ("bench", "--help")],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_lab_command_in_a_serving_install_says_which_package_brings_it(tmp_path, args):
    r = _peep(*args, cwd=tmp_path, no_lab=True)
    word = next(a for a in args if not a.startswith("-"))
    assert r.returncode == 2, r.stderr
    assert f"peep: `{word}` is not a command of peep-server" in r.stderr
    assert f"come with peep-lab: {LAB_INSTALL}" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_mistyped_command_with_the_lab_is_argparse_s_error(tmp_path):
    r = _peep("serv", cwd=tmp_path)
    assert r.returncode == 2 and "invalid choice: 'serv'" in r.stderr and "peep-lab" not in r.stderr


def test_the_serving_commands_work_without_the_lab(tmp_path):
    r = _peep("keys", "generate", "--out", str(tmp_path / "site"), cwd=tmp_path, no_lab=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site.key").is_file() and (tmp_path / "site.pub").is_file()
    r = _peep("qbbs", "enrol", "--help", cwd=tmp_path, no_lab=True)
    assert r.returncode == 0 and "--subject" in r.stdout, r.stderr
    r = _peep("qbbs", "evaluate", cwd=tmp_path, no_lab=True)
    assert r.returncode == 2 and "invalid choice: 'evaluate'" in r.stderr


@pytest.mark.parametrize(
    ("module", "command", "distribution"),
    [("peep.server.commands.retention", "retention", "peep-server"), ("peep.lab.commands.audit", "audit", "peep-lab")],
)
def test_a_command_that_does_not_load_is_an_error_not_a_missing_command(tmp_path, module, command, distribution):
    r = _peep("--help", block=(module,), cwd=tmp_path)
    assert r.returncode == 1
    assert f"the command `peep {command}` could not be loaded" in r.stderr
    assert f"this {distribution} install is incomplete or broken: reinstall it" in r.stderr
