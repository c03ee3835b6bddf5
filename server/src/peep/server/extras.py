"""Optional parts of peep-server, and the message when one is not installed.

``peep demo`` and the edge section of ``peep bench`` run the edge agent
(peep-edge). A server-only install does not have it; the extra ``demo``
(``pip install 'peep-server[demo]'``) adds it. Everything else in the server
works without it.
"""

from __future__ import annotations

from peep.server.errors import UsageError

#: The command that installs what :func:`require_edge` checks for.
DEMO_EXTRA_INSTALL = "pip install 'peep-server[demo]'"


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
