"""The enrolment desk: naming a track's kept templates as a subject."""

from __future__ import annotations

from peep.core.wire import ID_PATTERN, check_subject_id
from peep.server.console.http import Ctx
from peep.server.console.pages.base import Page
from starlette.responses import Response
from starlette.routing import Route


class EnrolPage(Page):
    """The routes and handlers of this page (the rules every request passes are the app's)."""

    def routes(self) -> list[Route]:
        r = self.app.route
        return [
            Route("/enrol", r(self.enrol_page, "enrol"), methods=["GET"]),
            Route("/enrol", r(self.enrol, "enrol"), methods=["POST"]),
        ]

    def enrol_page(self, ctx: Ctx, *, result: str = "", error: str = "", status: int = 200) -> Response:
        return self._page(
            ctx,
            "enrol.html",
            {
                "tracks": self.store.open_tracks(),
                "keep": self.services.config.recognition.keep,
                "result": result,
                "error": error,
            },
            status,
        )

    def enrol(self, ctx: Ctx) -> Response:
        device, track, raw = ctx.form.get("device", ""), ctx.form.get("track", ""), ctx.form.get("subject", "")
        try:
            if not ID_PATTERN.match(device):
                raise ValueError(
                    f"device: expected a device id of 1-128 characters [A-Za-z0-9_.:@-], received {device[:64]!r}"
                )
            if not (1 <= len(track) <= 128) or not track.isprintable():
                raise ValueError(f"track: expected a track id of 1-128 printable characters, received {track[:64]!r}")
            subject = check_subject_id(raw, "subject")
        except ValueError as exc:
            self._audit(ctx, "enrol", raw[:128], f"refused: {str(exc)[:200]}")
            return self.enrol_page(ctx, error=str(exc), status=400)
        prefix = self.services.config.training.background_prefix
        if prefix and subject.startswith(prefix) and (ctx.session is None or ctx.session.role != "admin"):
            # The ingestor's rule for devices: the class that teaches "unknown" is the administrator's.
            self._audit(ctx, "enrol", subject, "refused: background subject needs the admin role")
            return self.enrol_page(
                ctx,
                error=f"subject: expected a person's id (subjects starting {prefix!r} form the 'unknown' class; "
                "only an admin enrols them)",
                status=403,
            )
        limit = self.services.config.grpc.max_stream_messages
        keys = self.store.track_keys(device, track, limit=limit)
        if not keys:
            self._audit(ctx, "enrol", subject, f"refused: no open templates of {device}/{track[:64]}")
            return self.enrol_page(
                ctx, error=f"track: no templates of device {device} track {track} left to enrol", status=404
            )
        n = self.services.store.relabel(keys, subject)
        self._audit(ctx, "enrol", subject, f"{n} templates of {device}/{track[:64]}")
        return self.enrol_page(ctx, result=f"{n} templates of {device} / {track} enrolled as {subject}")
