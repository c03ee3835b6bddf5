"""Audit: the console's own audit log (who did what, on what, with what outcome), for managers."""

from __future__ import annotations

from peep.server.console.http import Ctx
from peep.server.console.pages.base import Page, number, query_string, text_param
from starlette.responses import Response
from starlette.routing import Route

#: Audit log entries a page.
AUDIT_PAGE = 100


class AuditPage(Page):
    """The routes and handlers of this page (the rules every request passes are the app's)."""

    def routes(self) -> list[Route]:
        r = self.app.route
        return [
            Route("/audit", r(self.audit_page, "manage"), methods=["GET"]),
        ]

    def audit_page(self, ctx: Ctx) -> Response:
        actor, action, outcome = text_param(ctx, "actor"), text_param(ctx, "action"), text_param(ctx, "outcome")
        before = number(ctx, "before")
        entries = self.store.audit_log(limit=AUDIT_PAGE, actor=actor, action=action, outcome=outcome, before_id=before)
        query = {"actor": actor, "action": action, "outcome": outcome}
        older = query_string({**query, "before": str(entries[-1].id)}) if len(entries) == AUDIT_PAGE else None
        return self._page(
            ctx,
            "audit.html",
            {
                "entries": entries,
                "accounts": self.store.accounts(),
                "actors": self.store.audit_actors(),
                "actions": self.store.audit_actions(),
                "actor": actor,
                "action": action,
                "outcome": outcome,
                "older": older,
                "newest": query_string(query) if before is not None else None,
            },
        )
