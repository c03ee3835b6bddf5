"""`peep` in a serving install (peep-server without its extra `lab`): the lab's commands are listed and say
which install they need; a command that fails to load for any other reason is an error, never left out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from peep.server.cli import COMMANDS
from peep.server.extras import DEMO_EXTRA_INSTALL, LAB_DEPENDENCIES, LAB_INSTALL, is_lab_module


def _peep(*args: str, block: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``peep ARGS`` in a fresh interpreter where importing each module of ``block`` fails as if absent."""
    code = (
        f"import sys; [sys.modules.__setitem__(m, None) for m in {block!r}];"
        "from peep.server.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def _serving(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _peep(*args, block=tuple(LAB_DEPENDENCIES), cwd=cwd)


LAB_COMMANDS = [c for c in COMMANDS if is_lab_module("peep.server.commands." + c.replace(" ", "_"))]


def test_the_lab_commands_are_the_ones_the_design_names():
    assert LAB_COMMANDS == ["audit", "qbbs evaluate", "anonymize", "bench", "demo", "sgap"]


def test_help_lists_every_command_and_the_lab_ones_as_needing_the_lab_install(tmp_path):
    r = _serving("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("    ") and line.split()}
    for command in COMMANDS:
        if " " not in command:
            assert command in lines, f"`peep --help` lost {command}:\n{r.stdout}"
    for command in ("audit", "anonymize", "bench", "sgap"):
        assert f"needs the lab install ({LAB_INSTALL})" in lines[command]
    # The demo runs the edge agent too: its extra brings peep-edge and the lab libraries the demo imports.
    assert f"needs the lab install ({DEMO_EXTRA_INSTALL})" in lines["demo"]
    for command in ("serve", "train", "erase", "retention", "events", "keys", "bundle", "console", "qbbs"):
        assert "lab" not in lines[command]


@pytest.mark.parametrize(
    "args",
    [
        ("audit", "--dataset", "lfw", "--mechanism", "peep", "--epsilons", "1", "--out", "out"),
        ("audit", "--help"),
        ("qbbs", "evaluate", "--dataset", "lfw", "--epsilon", "1", "--out", "out"),
        ("demo",),
        ("sgap", "train", "--lambda", "1", "--out", "out"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_lab_command_says_which_install_it_needs(tmp_path, args):
    r = _serving(*args, cwd=tmp_path)
    command = " ".join(args[:2]) if args[0] == "qbbs" else args[0]
    assert r.returncode == 2, r.stderr
    install = DEMO_EXTRA_INSTALL if command == "demo" else LAB_INSTALL
    assert f"peep {command}: needs the lab install: {install}" in r.stderr
    assert "matplotlib" in r.stderr  # which of the lab's dependencies are missing
    assert not (tmp_path / "out").exists()


def test_the_serving_commands_work_without_the_lab(tmp_path):
    r = _serving("keys", "generate", "--out", str(tmp_path / "site"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site.key").is_file() and (tmp_path / "site.pub").is_file()
    r = _serving("qbbs", "enrol", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "--subject" in r.stdout, r.stderr


@pytest.mark.parametrize("module", ["peep.server.commands.retention", "peep.server.commands.audit"])
def test_a_command_that_does_not_load_is_an_error_not_a_missing_command(tmp_path, module):
    # The lab's dependencies are installed here: a lab command that does not load is broken, like any other.
    r = _peep("--help", block=(module,), cwd=tmp_path)
    assert r.returncode == 1
    command = module.rpartition(".")[2]
    assert f"the command `peep {command}` could not be loaded ({module}" in r.stderr
    assert "reinstall" in r.stderr
