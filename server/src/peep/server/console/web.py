"""The console's web application (Starlette): the rules every request passes, and the pages it serves.

Each page is a class of its own in :mod:`peep.server.console.pages` (its routes and handlers); the app
wraps every handler a page declares with :meth:`ConsoleApp.route`.

Every request passes, in this order (:meth:`ConsoleApp._handle`):

1. **Session**: the ``__Host-peep_session`` cookie (``Secure; HttpOnly; SameSite=Strict; Path=/``) holds a
   random 256-bit id; the database keeps only its SHA-256, the account, the session's CSRF token and its
   expiry (``console.session_lifetime_s``, ``console.session_idle_s``). Without a valid session a page
   answers 303 to ``/login`` and anything else (events, JSON, every POST) 401.
2. **Role**: each route names the permission it needs (:data:`~peep.server.console.accounts.PERMISSIONS`);
   a role without it gets 403, and the refusal is audited. An account with a one-time password can only
   change it.
3. **CSRF**: every POST carries the session's token in the ``csrf`` form field (the login form a token
   bound to a short-lived cookie), compared in constant time; a request whose ``Origin`` is not the
   console's own is refused too. Forms are bounded (size, fields, no files) before they are parsed.
4. **Audit**: every state change and every refusal is written to ``console_audit`` (who, what, on what,
   outcome, address, when).

Every response carries a strict Content-Security-Policy (``default-src 'none'``; scripts, styles and
connections from the console itself only, so no inline script runs), ``X-Frame-Options: DENY``,
``Referrer-Policy: same-origin`` (``no-referrer`` would make browsers send ``Origin: null`` with forms),
``Cache-Control: no-store`` and HSTS. Templates autoescape and print every value through
:func:`~peep.server.console.text.shown`.

Actions go through :class:`~peep.server.services.Services`, as the gRPC API's do: erasure is
``Services.erase_subject`` (templates, soft traits, retraining, purging old versions, masking meanwhile),
training ``Trainer.start_background`` (the one-run-at-a-time lease), enrolment ``Store.relabel`` of a
track's templates (as ``EnrolSubject`` relabels message ids), with the same validation of subject ids.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from peep.server.console import accounts
from peep.server.console.feed import LiveFeed
from peep.server.console.http import LOGIN_COOKIE, MAX_BODY, MAX_FIELDS, SESSION_COOKIE, Ctx, Refused, SecurityHeaders
from peep.server.console.render import template_environment
from peep.server.console.store import ConsoleStore, KeptChoices, Session
from peep.server.console.text import shown
from peep.server.console.throttle import SharedLoginThrottle
from peep.server.storage.interface import is_database_outage
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

log = logging.getLogger(__name__)
#: What the console answers (503) while its database does not answer.
UNAVAILABLE = "the server's database is not answering (restarting or unreachable); try again in a few seconds"

HERE = Path(__file__).resolve().parent
Handler = Callable[[Ctx], Response]


class ConsoleApp:
    """The console: a Starlette application on the server's :class:`~peep.server.services.Services`.

    Parameters
    ----------
    services : Services
    pages : sequence of Page classes
        The console's pages (:data:`peep.server.console.pages.PAGES`); each is built on this app.
    store : ConsoleStore, optional
        Built on ``services.store`` when omitted.
    feed : LiveFeed, optional
        Built (and started) on ``services.events`` when omitted.
    qbbs : QbbsModule, optional
        The hosted QBBS module, for the odometer on the Privacy page.
    device_status : callable, optional
        ``() -> {device_id: (status, since, via)}``: the retained MQTT statuses (``via`` ``mqtt``) and the
        gRPC contacts (``grpc``); a source that gives ``(status, since)`` only is shown without a ``via``.
    device_reports : callable, optional
        ``() -> {device_id: (DeviceReport, received_at, via)}``: the devices' own reports (suppressed
        releases, the budgets in their configuration, an insecure broker), ``via`` ``mqtt`` (retained) or
        ``grpc`` (``ReportDevice``); ``(DeviceReport, received_at)`` is shown without a ``via``.
    home_assistant : callable, optional
        ``() -> publisher or None``: the MQTT bridge's Home Assistant publisher (its ``state()``), for the Home
        Assistant page; None (or a callable returning None) when nothing publishes.
    """

    def __init__(
        self,
        services: Any,
        *,
        pages: Sequence[type[Any]],
        store: ConsoleStore | None = None,
        feed: LiveFeed | None = None,
        qbbs: Any = None,
        device_status: Callable[[], dict[str, tuple[Any, ...]]] | None = None,
        device_reports: Callable[[], dict[str, tuple[Any, ...]]] | None = None,
        home_assistant: Callable[[], Any] | None = None,
    ) -> None:
        cfg = services.config.console
        if cfg is None:
            raise ValueError("console: expected a [console] section in server.toml, received none")
        self.cfg = cfg
        self.services = services
        self.store = store or ConsoleStore(services.store)
        self.feed = feed or LiveFeed(services.events, self.store, size=cfg.recent_events).start()
        #: Live's filter choices from the kept decisions, read in the background (a scan of every one).
        self.choices = KeptChoices(self.store.recognition_sites_and_devices).start()
        self.qbbs = qbbs
        self.device_status = device_status
        self.device_reports = device_reports
        self.home_assistant = home_assistant
        # Open Live event streams per session (each polls the feed): bounded, so one account cannot pile them up.
        self.streams: dict[str, int] = {}
        self.streams_lock = threading.Lock()
        # In the database: replicas behind one load balancer count the same failures.
        self.throttle = SharedLoginThrottle(self.store, attempts=cfg.login_attempts, window_s=cfg.login_window_s)
        self.env = template_environment()
        self.stopping = False
        #: The pages, each with its routes (:data:`peep.server.console.pages.PAGES`, handed in by whoever builds
        #: the app, so that the app does not import the pages that import it).
        self.pages = [page(self) for page in pages]
        routes: list[BaseRoute] = [route for page in self.pages for route in page.routes()]
        routes.append(Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"))
        self.app: ASGIApp = SecurityHeaders(Starlette(routes=routes))

    def close(self) -> None:
        self.stopping = True
        self.choices.stop()
        self.feed.stop()

    # ------------------------------------------------------------ the rules every request passes

    def route(
        self,
        handler: Handler,
        action: str | None,
        *,
        public: bool = False,
        api: bool = False,
        allow_must_change: bool = False,
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await self._handle(request, handler, action, public, api, allow_must_change)
            except Exception as exc:
                if isinstance(exc, Refused):
                    return self._refused(request, exc, api)
                if not is_database_outage(exc):
                    raise
                # The database restarting or away: the operator is told to wait, never shown a driver's text.
                log.warning("console: the database did not answer", extra={"path": request.url.path[:200],
                                                                           "error": str(exc)[:200]})  # fmt: skip
                return self._refused(request, Refused(503, UNAVAILABLE), api)

        return endpoint

    def _refused(self, request: Request, exc: Refused, api: bool) -> Response:
        """A refusal as a page (a browser's GET or POST) or as text (an API call, 401, 429)."""
        page = request.method in ("GET", "POST") and exc.status not in (401, 429) and not api
        retry = {429: "60", 503: "5"}.get(exc.status)
        headers = {"retry-after": retry} if retry else None
        if not page:
            return PlainTextResponse(shown(str(exc)), status_code=exc.status, headers=headers)
        ctx = Ctx(request, exc.session) if exc.session is not None else None
        values = {"title": "Unavailable" if exc.status == 503 else "Refused", "message": str(exc), "refused": True}
        response = self.page(ctx, "message.html", values, exc.status)
        response.headers.update(headers or {})
        return response

    async def session_of(self, request: Request) -> tuple[Session | None, str]:
        sid = request.cookies.get(SESSION_COOKIE, "")
        if not sid or len(sid) > 128:
            return None, ""
        s = await run_in_threadpool(
            self.store.session,
            accounts.token_digest(sid),
            idle_s=min(self.cfg.session_idle_s, self.cfg.session_lifetime_s),
        )
        return s, sid

    async def _handle(
        self, request: Request, handler: Handler, action: str | None, public: bool, api: bool, allow_must_change: bool
    ) -> Response:
        session, sid = await self.session_of(request)
        try:
            return await self._checked(request, handler, action, public, api, allow_must_change, session, sid)
        except Refused as exc:
            exc.session = session
            raise

    async def _checked(
        self,
        request: Request,
        handler: Handler,
        action: str | None,
        public: bool,
        api: bool,
        allow_must_change: bool,
        session: Session | None,
        sid: str,
    ) -> Response:
        address = request.client.host if request.client else "-"
        if not public and session is None:
            if request.method == "GET" and not api:
                return RedirectResponse("/login", status_code=303)
            raise Refused(401, "a console session is required: log in at /login")
        if session is not None and session.must_change and not allow_must_change and not public:
            if request.method == "GET" and not api:
                return RedirectResponse("/password", status_code=303)
            raise Refused(403, "change the one-time password at /password first")
        ctx = Ctx(request, session, address=address, session_id=sid)
        if action is not None and session is not None and not accounts.allowed(session.role, action):
            await run_in_threadpool(
                self.store.audit, session.name, f"denied:{action}", request.url.path, f"role {session.role}", address
            )
            raise Refused(403, f"the role {session.role!r} may not {action} (it needs a role with {action!r})")
        if request.method == "POST":
            ctx.form = await self._form(request)
            self._check_origin(request)
            expected = session.csrf if session is not None and not public else request.cookies.get(LOGIN_COOKIE, "")
            got = ctx.form.get("csrf", "")
            if not expected or not hmac.compare_digest(got.encode(), expected.encode()):
                await run_in_threadpool(
                    self.store.audit, ctx.actor, "denied:csrf", request.url.path, "bad token", address
                )
                raise Refused(403, "csrf: expected the form's token of this session, received a missing or wrong one")
        return await run_in_threadpool(handler, ctx)

    @staticmethod
    async def _form(request: Request) -> dict[str, str]:
        length = request.headers.get("content-length")
        if (length is None or length == "0") and "transfer-encoding" not in request.headers:
            return {}  # an empty form (then refused for its missing CSRF token)
        if length is None or not length.isdigit() or int(length) > MAX_BODY:
            raise Refused(413, f"request: expected a form of at most {MAX_BODY} bytes with a Content-Length")
        ctype = request.headers.get("content-type", "").split(";")[0].strip()
        if ctype != "application/x-www-form-urlencoded":
            raise Refused(415, f"content-type: expected application/x-www-form-urlencoded, received {ctype[:64]!r}")
        async with request.form(max_files=0, max_fields=MAX_FIELDS) as form:
            out: dict[str, str] = {}
            for k, v in form.multi_items():
                if not isinstance(v, str) or k in out:
                    raise Refused(400, f"{k[:32]}: expected one text value")
                out[k] = v
        return out

    @staticmethod
    def _check_origin(request: Request) -> None:
        origin = request.headers.get("origin")
        if origin is None:
            return  # SameSite=Strict and the CSRF token carry the check
        own = f"{request.url.scheme}://{request.url.netloc}"
        if origin != own:
            raise Refused(403, f"origin: expected {own}, received {origin[:100]!r}")

    def audit(self, ctx: Ctx, action: str, target: str, outcome: str) -> None:
        self.store.audit(ctx.actor, action, target, outcome, ctx.address)

    # ------------------------------------------------------------ rendering

    def page(self, ctx: Ctx | None, name: str, values: dict[str, Any], status: int = 200) -> HTMLResponse:
        session = ctx.session if ctx else None
        perms = accounts.PERMISSIONS.get(session.role, frozenset()) if session else frozenset()  # type: ignore[call-overload]
        html = self.env.get_template(name).render(
            session=session,
            perms=perms,
            csrf=session.csrf if session else "",
            path=ctx.request.url.path if ctx else "",
            **values,
        )
        return HTMLResponse(html, status_code=status)
