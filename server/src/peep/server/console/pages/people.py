"""People: the enrolled subjects, what the database keeps, and erasure."""

from __future__ import annotations

from typing import Any

from peep.core.exceptions import WireError
from peep.core.wire import check_subject_id
from peep.server.console.http import Ctx
from peep.server.console.pages.base import Page
from starlette.responses import Response
from starlette.routing import Route


class PeoplePage(Page):
    """The routes and handlers of this page (the rules every request passes are the app's)."""

    def routes(self) -> list[Route]:
        r = self.app.route
        return [
            Route("/people", r(self.people, "view"), methods=["GET"]),
            Route("/people/erase", r(self.erase, "erase"), methods=["POST"]),
        ]

    def people(self, ctx: Ctx, *, result: Any = None, error: str = "", status: int = 200) -> Response:
        subjects = self.store.subjects()
        prefix = self.services.config.training.background_prefix
        m = self.services.recogniser.model
        return self._page(
            ctx,
            "people.html",
            {
                "subjects": [(s, n, t) for s, n, t in subjects if not s.startswith(prefix)],
                "n_background": sum(1 for s, _, _ in subjects if s.startswith(prefix)),
                "model": m,
                "kept": self.kept(),
                "result": result,
                "error": error,
            },
            status,
        )

    def erase(self, ctx: Ctx) -> Response:
        from peep.server.services import NoSuchSubject

        raw, confirm = ctx.form.get("subject", ""), ctx.form.get("confirm", "")
        try:
            subject = check_subject_id(raw, "subject")
        except WireError as exc:
            self._audit(ctx, "erase", raw[:128], "refused: invalid subject")
            return self.people(ctx, error=str(exc), status=400)
        if confirm != subject:
            self._audit(ctx, "erase", subject, "refused: not confirmed")
            return self.people(
                ctx, error="confirm: expected the subject id typed again to confirm the erasure", status=400
            )
        try:
            result = self.services.erase_subject(subject, retrain=True)
        except NoSuchSubject as exc:
            self._audit(ctx, "erase", subject, "refused: no such subject")
            return self.people(ctx, error=str(exc), status=404)
        self._audit(
            ctx, "erase", subject,
            f"templates {result.templates_deleted}, soft traits {result.soft_traits_deleted}, "
            f"model {result.model_version}, purged {','.join(result.versions_purged) or '-'}",
        )  # fmt: skip
        return self.people(ctx, result=result)
