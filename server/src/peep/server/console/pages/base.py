"""What every console page shares: its app, rendering, the audit log, and the query parameters it reads.

A page is a class with its routes and their handlers; the rules every request passes (session, role,
CSRF, bounded forms, audit of refusals) stay in :class:`~peep.server.console.web.ConsoleApp`, which wraps
each handler a page declares with :meth:`~peep.server.console.web.ConsoleApp.route`. Query parameters are
bounded where they are read, and a bad one is refused with a message naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from peep.core.wire import ID_PATTERN
from peep.server.console.http import Ctx, Refused
from starlette.responses import HTMLResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from peep.server.console.store import ConsoleStore
    from peep.server.console.web import ConsoleApp


class Page:
    """One page of the console (or a few that belong together): routes and handlers on ``app``.

    Parameters
    ----------
    app : ConsoleApp
        The console whose services, store and rendering the page uses.
    """

    def __init__(self, app: ConsoleApp) -> None:
        self.app = app

    def routes(self) -> list[Route]:
        """The page's routes, each handler wrapped by ``app.route`` with the permission it needs."""
        raise NotImplementedError

    @property
    def services(self) -> Any:
        return self.app.services

    @property
    def store(self) -> ConsoleStore:
        return self.app.store

    @property
    def cfg(self) -> Any:
        return self.app.cfg

    def _page(self, ctx: Ctx | None, name: str, values: dict[str, Any], status: int = 200) -> HTMLResponse:
        return self.app.page(ctx, name, values, status)

    def _audit(self, ctx: Ctx, action: str, target: str, outcome: str) -> None:
        self.app.audit(ctx, action, target, outcome)

    def kept(self) -> dict[str, Any]:
        """What the database keeps, per category, with how long (the People and Privacy pages)."""
        from peep.server.services import kept_rows

        cfg = self.services.config
        counts = self.services.store.kept_counts(cfg.training.background_prefix)
        return {"rows": kept_rows(cfg, counts), "keep": cfg.recognition.keep, "counts": counts}


def id_filter(ctx: Ctx, key: str) -> str:
    """Query parameter ``key``: '' or an id (site, device)."""
    value = ctx.request.query_params.get(key, "")
    if value and not ID_PATTERN.match(value):
        raise Refused(400, f"{key}: expected '' or an id of 1-128 characters [A-Za-z0-9_.:@-], received {value[:64]!r}")
    return value


def choice(ctx: Ctx, key: str, choices: Any, default: str = "") -> str:
    """Query parameter ``key``: one of ``choices``."""
    value = ctx.request.query_params.get(key, default)
    if value not in choices:
        raise Refused(400, f"{key}: expected one of {', '.join(repr(c) for c in choices)}, received {value[:32]!r}")
    return value


def number(ctx: Ctx, key: str) -> int | None:
    """Query parameter ``key``: absent, or a whole number (a page's ``before`` id)."""
    value = ctx.request.query_params.get(key, "")
    if not value:
        return None
    if not value.isdigit() or len(value) > 18:
        raise Refused(400, f"{key}: expected a whole number, received {value[:32]!r}")
    return int(value)


def text_param(ctx: Ctx, key: str, limit: int = 64) -> str:
    """Query parameter ``key``: at most ``limit`` printable characters."""
    value = ctx.request.query_params.get(key, "")
    if len(value) > limit or not value.isprintable():
        raise Refused(400, f"{key}: expected at most {limit} printable characters, received {value[:limit]!r}")
    return value


def query_string(params: dict[str, str]) -> str:
    """``?k=v&…`` of the non-empty values (the page links keep the filters)."""
    return "?" + urlencode({k: v for k, v in params.items() if v})


def local_back(back: str, prefix: str) -> bool:
    """Whether ``back`` is a path of this console under ``prefix`` (never another host: ``//x`` or ``\\x``)."""
    return back.startswith(prefix) and len(back) < 300 and "//" not in back and "\\" not in back
