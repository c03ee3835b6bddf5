"""People: the enrolled subjects, what the database keeps, erasure, and who opted in to be shown in Home Assistant.

Showing someone in Home Assistant is off by default; the role that may erase a subject (``erase``) may record that
they agreed to be shown, under the display name they agreed to, and withdraw it. The audit log records each change
and refusal, never the display name (the log outlives an erasure; the name is kept only while the person agrees).
"""

from __future__ import annotations

import time
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
            Route("/people/home-assistant", r(self.home_assistant, "erase"), methods=["POST"]),
        ]

    def people(self, ctx: Ctx, *, result: Any = None, error: str = "", notice: str = "", status: int = 200) -> Response:
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
                "notice": notice,
                "shown": self.services.store.home_assistant_people(),
                "ha_enabled": self.services.config.home_assistant.enabled,
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
        self._people_changed()
        return self.people(ctx, result=result)

    def home_assistant(self, ctx: Ctx) -> Response:
        """Opt a subject in to Home Assistant under the display name they agreed to, rename, or opt them out."""
        from peep.server.storage import check_display_name

        raw, action = ctx.form.get("subject", ""), ctx.form.get("action", "")
        try:
            subject = check_subject_id(raw, "subject")
        except WireError as exc:
            self._audit(ctx, "home-assistant", raw[:128], "refused: invalid subject")
            return self.people(ctx, error=str(exc), status=400)
        store = self.services.store
        if action == "opt-out":
            was = store.clear_home_assistant_person(subject)
            self._audit(ctx, "home-assistant", subject, "opted out" if was else "opted out: was not opted in")
            self._people_changed()
            return self.people(ctx, notice=f"{subject} is no longer shown in Home Assistant" if was else
                               f"{subject} was not shown in Home Assistant")  # fmt: skip
        if action != "opt-in":
            self._audit(ctx, "home-assistant", subject, "refused: no such action")
            return self.people(ctx, error="action: expected 'opt-in' or 'opt-out'", status=400)
        if ctx.form.get("agreed", "") != "yes":
            self._audit(ctx, "home-assistant", subject, "refused: agreement not confirmed")
            return self.people(ctx, error="agreed: expected the box ticked that the person agreed to be shown under "
                               "this name", status=400)  # fmt: skip
        try:
            name = check_display_name(ctx.form.get("name", ""), "name")
        except ValueError as exc:
            self._audit(ctx, "home-assistant", subject, "refused: invalid display name")
            return self.people(ctx, error=str(exc), status=400)
        prefix = self.services.config.training.background_prefix
        if subject.startswith(prefix) or not store.count_templates(subject=subject, purpose="enroll"):
            self._audit(ctx, "home-assistant", subject, "refused: not an enrolled subject")
            return self.people(ctx, error=f"subject: {subject!r} is not an enrolled subject", status=404)
        new = store.set_home_assistant_person(subject, name, time.time())
        self._audit(ctx, "home-assistant", subject, "opted in" if new else "display name changed")
        self._people_changed()
        return self.people(ctx, notice=f"{subject} is shown in Home Assistant as {name}")

    def _people_changed(self) -> None:
        """This server's publisher re-reads who is shown now (other replicas within their refresh, 10 s)."""
        publisher = self.app.home_assistant() if self.app.home_assistant is not None else None
        people = getattr(publisher, "people", None)
        if people is not None:
            people.reload()
