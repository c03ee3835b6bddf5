"""The console's web application (Starlette): routes, the rules every request passes, the pages.

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

import asyncio
import hmac
import json
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup
from peep.core.exceptions import WireError
from peep.core.wire import ID_PATTERN, check_subject_id
from peep.server.console import accounts, plots
from peep.server.console.accounts import Throttled
from peep.server.console.devicemodels import issued_view, report_decision
from peep.server.console.feed import LiveEvent, LiveFeed
from peep.server.console.http import (
    LOGIN_COOKIE,
    MAX_BODY,
    MAX_FIELDS,
    MAX_STREAMS,
    MAX_STREAMS_PER_SESSION,
    SESSION_COOKIE,
    Ctx,
    Refused,
    SecurityHeaders,
)
from peep.server.console.render import _time, _transports, template_environment
from peep.server.console.store import (
    DECISIONS,
    ConsoleStore,
    KeptChoices,
    Recognition,
    Session,
    SharedLoginThrottle,
)
from peep.server.console.text import shown
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
Handler = Callable[[Ctx], Response]


#: The Devices chart's buckets: (longest span of data, bucket width) in seconds, the first that fits.
EPSILON_BUCKETS: tuple[tuple[float, float], ...] = ((2 * 3600, 60.0), (12 * 3600, 600.0), (3 * 86_400, 3600.0))
#: The Live page's time filter: how far back (seconds; 0: every decision kept).
PERIODS: dict[str, int] = {"1h": 3600, "24h": 86_400, "7d": 7 * 86_400, "all": 0}
RECOGNITIONS_PAGE = 50
AUDIT_PAGE = 100
ALERT_GROUPS_PAGE = 20
#: Unknown-face alerts are grouped per device and per this window (an hour reads as one line).
ALERT_WINDOW_S = 3600.0
#: "Acknowledge every alert older than …" (seconds, label); 0 acknowledges all of them.
ACK_AGES: tuple[tuple[int, str], ...] = ((3600, "older than an hour"), (86_400, "older than a day"), (0, "all"))


def _decision_of(e: Any) -> str:
    """What a feed event decided, in the Live filter's terms (:data:`~.store.DECISIONS`)."""
    if e.purpose == "verify":
        return "accepted" if e.accepted else "refused"
    return "unknown" if e.unknown else "named"


def _recognition(e: LiveEvent) -> Recognition:
    """A feed event as a kept decision is listed (not yet written: no id)."""
    return Recognition(
        0, e.event_id, e.time, e.site, e.device_id, e.track_id, e.purpose, e.subject, e.unknown, e.accepted,
        e.probability, e.model_version,
    )  # fmt: skip


def _query(params: dict[str, str]) -> str:
    """``?k=v&…`` of the non-empty values (the page links keep the filters)."""
    return "?" + urlencode({k: v for k, v in params.items() if v})


def _local_back(back: str, prefix: str) -> bool:
    """Whether ``back`` is a path of this console under ``prefix`` (never another host: ``//x`` or ``\\x``)."""
    return back.startswith(prefix) and len(back) < 300 and "//" not in back and "\\" not in back


class ConsoleApp:
    """The console: a Starlette application on the server's :class:`~peep.server.services.Services`.

    Parameters
    ----------
    services : Services
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
    """

    def __init__(
        self,
        services: Any,
        *,
        store: ConsoleStore | None = None,
        feed: LiveFeed | None = None,
        qbbs: Any = None,
        device_status: Callable[[], dict[str, tuple[Any, ...]]] | None = None,
        device_reports: Callable[[], dict[str, tuple[Any, ...]]] | None = None,
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
        # In the database: replicas behind one load balancer count the same failures.
        # Open Live event streams per session (each polls the feed): bounded, so one account cannot pile them up.
        self._streams: dict[str, int] = {}
        self._streams_lock = threading.Lock()
        self.throttle = SharedLoginThrottle(self.store, attempts=cfg.login_attempts, window_s=cfg.login_window_s)
        self.env = template_environment()
        self.stopping = False
        r = self._route
        routes = [
            Route("/", r(self.home, None), methods=["GET"]),
            Route("/login", r(self.login_page, None, public=True), methods=["GET"]),
            Route("/login", r(self.login, None, public=True), methods=["POST"]),
            Route("/logout", r(self.logout, None, allow_must_change=True), methods=["POST"]),
            Route("/password", r(self.password_page, None, allow_must_change=True), methods=["GET"]),
            Route("/password", r(self.password, None, allow_must_change=True), methods=["POST"]),
            Route("/live", r(self.live, "view"), methods=["GET"]),
            Route("/live/events", self._events, methods=["GET"]),
            Route("/alerts/ack", r(self.acknowledge, "acknowledge"), methods=["POST"]),
            Route("/devices", r(self.devices, "view"), methods=["GET"]),
            Route("/people", r(self.people, "view"), methods=["GET"]),
            Route("/people/erase", r(self.erase, "erase"), methods=["POST"]),
            Route("/models", r(self.models, "view"), methods=["GET"]),
            Route("/models/status", r(self.model_status, "view", api=True), methods=["GET"]),
            Route("/models/train", r(self.train, "train"), methods=["POST"]),
            Route("/models/current", r(self.make_current, "train"), methods=["POST"]),
            Route("/privacy", r(self.privacy, "view"), methods=["GET"]),
            Route("/audit", r(self.audit_page, "manage"), methods=["GET"]),
            Route("/enrol", r(self.enrol_page, "enrol"), methods=["GET"]),
            Route("/enrol", r(self.enrol, "enrol"), methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
        ]
        self.app: ASGIApp = SecurityHeaders(Starlette(routes=routes))

    def close(self) -> None:
        self.stopping = True
        self.choices.stop()
        self.feed.stop()

    # ------------------------------------------------------------ the rules every request passes

    def _route(
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
            except Refused as exc:
                page = (request.method == "GET" and exc.status not in (401, 429) and not api) or (
                    request.method == "POST" and exc.status not in (401, 429) and not api
                )
                if not page:
                    headers = {"retry-after": "60"} if exc.status == 429 else None
                    return PlainTextResponse(shown(str(exc)), status_code=exc.status, headers=headers)
                ctx = Ctx(request, exc.session) if exc.session is not None else None
                values = {"title": "Refused", "message": str(exc), "refused": True}
                return self._page(ctx, "message.html", values, exc.status)

        return endpoint

    async def _session(self, request: Request) -> tuple[Session | None, str]:
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
        session, sid = await self._session(request)
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

    def _audit(self, ctx: Ctx, action: str, target: str, outcome: str) -> None:
        self.store.audit(ctx.actor, action, target, outcome, ctx.address)

    # ------------------------------------------------------------ rendering

    def _page(self, ctx: Ctx | None, name: str, values: dict[str, Any], status: int = 200) -> HTMLResponse:
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

    def _message(self, ctx: Ctx, title: str, message: str, status: int = 200, **more: Any) -> HTMLResponse:
        return self._page(ctx, "message.html", {"title": title, "message": message, **more}, status)

    # ------------------------------------------------------------ login, logout, password

    def home(self, ctx: Ctx) -> Response:
        assert ctx.session is not None
        target = "/live" if accounts.allowed(ctx.session.role, "view") else "/enrol"
        return RedirectResponse(target, status_code=303)

    def login_page(self, ctx: Ctx, *, error: str = "", status: int = 200) -> Response:
        token = accounts.new_token()
        changed = ctx.request.query_params.get("changed") == "1" and not error
        resp = self._page(None, "login.html", {"login_csrf": token, "error": error, "changed": changed}, status)
        resp.set_cookie(LOGIN_COOKIE, token, max_age=600, path="/", secure=True, httponly=True, samesite="strict")
        return resp

    def login(self, ctx: Ctx) -> Response:
        name = ctx.form.get("name", "")[:64]
        password = ctx.form.get("password", "")
        try:
            self.throttle.check(name, ctx.address)
        except Throttled as exc:
            self.store.audit(name or "-", "login", "", "throttled", ctx.address)
            return self.login_page(ctx, error=str(exc), status=429)
        account = self.store.account(name) if accounts._NAME.match(name) else None
        ok = accounts.verify_password(password, account.password_hash if account else None)
        if not ok or account is None or account.disabled:
            self.throttle.failed(name, ctx.address)
            self.store.audit(name or "-", "login", "", "failed", ctx.address)
            return self.login_page(ctx, error="wrong account name or password", status=401)
        self.throttle.succeeded(name)
        sid, csrf = accounts.new_token(), accounts.new_token()
        self.store.create_session(accounts.token_digest(sid), name, csrf, lifetime_s=self.cfg.session_lifetime_s)
        self.store.audit(name, "login", "", "ok", ctx.address)
        resp = RedirectResponse("/password" if account.must_change else "/", status_code=303)
        resp.set_cookie(
            SESSION_COOKIE, sid, max_age=int(self.cfg.session_lifetime_s), path="/", secure=True, httponly=True,
            samesite="strict",
        )  # fmt: skip
        resp.delete_cookie(LOGIN_COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return resp

    def logout(self, ctx: Ctx) -> Response:
        self.store.end_session(accounts.token_digest(ctx.session_id))
        self._audit(ctx, "logout", "", "ok")
        resp = RedirectResponse("/login", status_code=303)
        resp.delete_cookie(SESSION_COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return resp

    def password_page(self, ctx: Ctx, *, error: str = "", status: int = 200) -> Response:
        return self._page(ctx, "password.html", {"error": error}, status)

    def password(self, ctx: Ctx) -> Response:
        assert ctx.session is not None
        name = ctx.session.name
        account = self.store.account(name)
        if account is None or not accounts.verify_password(ctx.form.get("current", ""), account.password_hash):
            self._audit(ctx, "password", name, "wrong current password")
            return self.password_page(ctx, error="current: the password given is not this account's", status=400)
        new, again = ctx.form.get("new", ""), ctx.form.get("again", "")
        try:
            if new != again:
                raise accounts.AccountError("again: expected the new password twice, received two different ones")
            sites = sorted({d.site for d in self.services.config.auth.devices if d.site})
            accounts.check_new_password(new, name=name, sites=sites)
            if accounts.verify_password(new, account.password_hash):
                raise accounts.AccountError("new: expected a password other than the current one")
        except accounts.AccountError as exc:
            # The form's field is "new": the rules name the password as such.
            message = str(exc)
            message = "new " + message if message.startswith("password:") else message
            return self.password_page(ctx, error=message, status=400)
        self.store.reset_password(name, accounts.hash_password(new), must_change=False)  # ends every session
        self._audit(ctx, "password", name, "changed")
        resp = RedirectResponse("/login?changed=1", status_code=303)
        resp.delete_cookie(SESSION_COOKIE, path="/", secure=True, httponly=True, samesite="strict")
        return resp

    # ------------------------------------------------------------ Live

    @staticmethod
    def _filter(ctx: Ctx, key: str) -> str:
        value = ctx.request.query_params.get(key, "")
        if value and not ID_PATTERN.match(value):
            raise Refused(
                400, f"{key}: expected '' or an id of 1-128 characters [A-Za-z0-9_.:@-], received {value[:64]!r}"
            )
        return value

    def _choice(self, ctx: Ctx, key: str, choices: Any, default: str = "") -> str:
        value = ctx.request.query_params.get(key, default)
        if value not in choices:
            raise Refused(400, f"{key}: expected one of {', '.join(repr(c) for c in choices)}, received {value[:32]!r}")
        return value

    @staticmethod
    def _number(ctx: Ctx, key: str) -> int | None:
        value = ctx.request.query_params.get(key, "")
        if not value:
            return None
        if not value.isdigit() or len(value) > 18:
            raise Refused(400, f"{key}: expected a whole number, received {value[:32]!r}")
        return int(value)

    def live(self, ctx: Ctx) -> Response:
        site, device = self._filter(ctx, "site"), self._filter(ctx, "device")
        decision = self._choice(ctx, "decision", ("", *DECISIONS))
        period = self._choice(ctx, "period", tuple(PERIODS), "24h")
        before = self._number(ctx, "before")
        alert_page = self._number(ctx, "alerts") or 0
        now = time.time()
        since = now - PERIODS[period] if PERIODS[period] else None
        kept_sites, kept_devices = self.choices.get()
        feed_sites, feed_devices = self.feed.sites_and_devices()
        configured = {d.id: d.site for d in self.services.config.auth.devices}
        # The filter in use stays selectable (a link may name a site the last reading had not seen yet).
        sites = sorted(set(kept_sites) | set(feed_sites) | {s for s in configured.values() if s} | {site} - {""})
        devices = sorted(set(kept_devices) | set(feed_devices) | set(configured) | {device} - {""})
        events = self.store.recognitions(
            since=since, site=site, device_id=device, decision=decision, before_id=before, limit=RECOGNITIONS_PAGE
        )
        total = self.store.count_recognitions(since=since, site=site, device_id=device, decision=decision)
        first_page = before is None
        if first_page:
            # Decisions reach the database up to a second after they happen (written in batches): the newest
            # are taken from the feed's memory so that the page and its event stream leave no gap.
            listed = {e.event_id for e in events}
            newest = events[0].at if events else (since or 0.0)
            fresh = [
                _recognition(e)
                for e in self.feed.recent(site=site, device_id=device, limit=RECOGNITIONS_PAGE)
                if e.event_id not in listed and e.time >= newest and (not decision or _decision_of(e) == decision)
            ]
            events = (fresh + events)[:RECOGNITIONS_PAGE]
        groups, n_groups = self.store.alert_groups(
            window_s=ALERT_WINDOW_S, site=site, device_id=device, limit=ALERT_GROUPS_PAGE,
            offset=alert_page * ALERT_GROUPS_PAGE,
        )  # fmt: skip
        query = {"site": site, "device": device, "decision": decision, "period": period}
        older = None
        if len(events) == RECOGNITIONS_PAGE and events[-1].id:
            older = _query({**query, "before": str(events[-1].id)})
        since_h = now - 24 * 3600
        hourly = dict(self.store.hourly(since_h))
        now_h = int(now // 3600)
        hours = list(range(now_h - 23, now_h + 1))
        plot = plots.bars(
            "Recognitions per hour (last 24 h, UTC)",
            [f"{h % 24:02d}" for h in hours],
            [float(hourly.get(h, 0)) for h in hours],
            y_label="recognitions",
        )
        return self._page(
            ctx,
            "live.html",
            {
                "events": events,
                "n_events": total,
                "first_page": first_page,
                "streaming": first_page and not decision,
                "older": older,
                "newest": _query(query) if not first_page else None,
                "last_seq": self.feed.last_seq,
                "groups": groups,
                "n_groups": n_groups,
                "n_alerts": self.store.count_alerts(site=site, device_id=device),
                "alert_page": alert_page,
                "alert_pages": max(1, math.ceil(n_groups / ALERT_GROUPS_PAGE)),
                "alert_query": {k: v for k, v in query.items() if v},
                "alert_window_min": int(ALERT_WINDOW_S // 60),
                "ack_ages": ACK_AGES,
                "site": site,
                "device": device,
                "decision": decision,
                "decisions": list(DECISIONS),
                "period": period,
                "periods": list(PERIODS),
                "sites": sites,
                "devices": devices,
                "events_days": self.services.config.recognition.events_days,
                "plot": Markup(plot),
            },
        )

    async def _events(self, request: Request) -> Response:
        """Server-sent events: each new recognition (filtered by ``site``/``device``) as one JSON message."""
        session, sid = await self._session(request)
        if session is None:
            return PlainTextResponse("a console session is required: log in at /login", status_code=401)
        if session.must_change:
            return PlainTextResponse("change the one-time password at /password first", status_code=403)
        if not accounts.allowed(session.role, "view"):
            return PlainTextResponse(f"the role {session.role!r} may not view", status_code=403)
        site = request.query_params.get("site", "")
        device = request.query_params.get("device", "")
        for key, value in (("site", site), ("device", device)):
            if value and not ID_PATTERN.match(value):
                return PlainTextResponse(
                    f"{key}: expected '' or an id, received {shown(value[:64])!r}", status_code=400
                )
        after = request.query_params.get("after", "")
        seq = int(after) if after.isdigit() and len(after) < 19 else self.feed.last_seq
        key = accounts.token_digest(sid)
        with self._streams_lock:
            mine = self._streams.get(key, 0)
            if mine >= MAX_STREAMS_PER_SESSION or sum(self._streams.values()) >= MAX_STREAMS:
                return PlainTextResponse(
                    f"event streams: at most {MAX_STREAMS_PER_SESSION} per session and {MAX_STREAMS} in all are open; "
                    "close a Live tab",
                    status_code=429,
                    headers={"retry-after": "10"},
                )
            self._streams[key] = mine + 1

        async def stream() -> Any:
            try:
                async for chunk in _stream():
                    yield chunk
            finally:
                with self._streams_lock:
                    left = self._streams.get(key, 1) - 1
                    if left > 0:
                        self._streams[key] = left
                    else:
                        self._streams.pop(key, None)

        async def _stream() -> Any:
            nonlocal seq
            last_beat = last_check = time.monotonic()
            yield "retry: 2000\n\n"
            while not self.stopping:
                if await request.is_disconnected():
                    return
                top = self.feed.last_seq
                for e in self.feed.since(seq, site=site, device_id=device):
                    data = {k: (shown(v) if isinstance(v, str) else v) for k, v in e.as_json().items()}
                    data["time_text"] = _time(e.time)
                    yield f"id: {e.seq}\ndata: {json.dumps(data)}\n\n"
                seq = top
                now = time.monotonic()
                if now - last_beat > 15:
                    last_beat = now
                    yield ": keep-alive\n\n"
                if now - last_check > 30:  # a session ended elsewhere (logout, expiry) ends the stream
                    last_check = now
                    s, _ = await self._session(request)
                    if s is None:
                        return
                await asyncio.sleep(0.2)

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    def acknowledge(self, ctx: Ctx) -> Response:
        """Acknowledge one alert (``event_id``), a group (``device`` + ``from``/``to``), or every alert older than
        ``older_than`` seconds (0: all) matching the page's ``site``/``device`` filters."""
        assert ctx.session is not None
        f = ctx.form
        event_id = f.get("event_id", "")
        if event_id:
            if not (1 <= len(event_id) <= 64) or not event_id.isalnum():
                raise Refused(400, f"event_id: expected an alert's event id (hex), received {event_id[:64]!r}")
            ok = self.store.acknowledge(event_id, ctx.session.name)
            self._audit(ctx, "acknowledge", event_id, "ok" if ok else "no such open alert")
        else:
            site, device = f.get("site", ""), f.get("device", "")
            for key, value in (("site", site), ("device", device)):
                if value and not ID_PATTERN.match(value):
                    raise Refused(400, f"{key}: expected '' or an id, received {value[:64]!r}")
            since = before = None
            if "older_than" in f:
                age = f["older_than"]
                if age not in {str(a) for a, _ in ACK_AGES}:
                    raise Refused(400, f"older_than: expected one of {[a for a, _ in ACK_AGES]}, received {age[:16]!r}")
                before = time.time() - int(age)
            else:
                lo, hi = f.get("from", ""), f.get("to", "")
                try:
                    since, before = float(lo), float(hi)
                except ValueError:
                    raise Refused(400, f"from, to: expected a group's window in seconds, received {lo[:20]!r}, "
                                       f"{hi[:20]!r}") from None  # fmt: skip
                if not (math.isfinite(since) and math.isfinite(before) and since < before):
                    raise Refused(400, "from, to: expected a window with from < to")
            n = self.store.acknowledge_many(ctx.session.name, site=site, device_id=device, since=since, before=before)
            what = f"device {device or 'any'}, site {site or 'any'}, " + (
                f"older than {f['older_than']} s" if "older_than" in f else f"{_time(since)}–{_time(before)}"
            )
            self._audit(ctx, "acknowledge-many", what, f"{n} alerts")
        back = f.get("back", "/live")
        return RedirectResponse(back if _local_back(back, "/live") else "/live", status_code=303)

    # ------------------------------------------------------------ Devices

    def devices(self, ctx: Ctx) -> Response:
        summaries = {d.device_id: d for d in self.store.devices()}
        configured = {d.id: d for d in self.services.config.auth.devices}
        status = self.device_status() if self.device_status else {}
        reports = self.device_reports() if self.device_reports else {}
        now = time.time()
        rows = []
        # A device known only by its report is listed too: its report may carry a warning.
        for dev in sorted(set(summaries) | set(configured) | set(status) | set(reports)):
            s = summaries.get(dev)
            c = configured.get(dev)
            st = status.get(dev)
            rep = reports.get(dev)
            rows.append(
                {
                    "id": dev,
                    "site": (s.site if s else "") or (c.site if c and c.site else ""),
                    "registered": c is not None,
                    "enrolment_desk": bool(c and c.enrolment_desk),
                    "status": st[0] if st else ("never seen" if self.device_status else "not watched"),
                    "status_since": st[1] if st else None,
                    # How the status was learnt, when the source says; never assumed.
                    "status_via": st[2] if st and len(st) > 2 else "",
                    "s": s,
                    "transports": _transports(s.transports) if s else [],
                    "report": rep[0] if rep else None,
                    "report_at": rep[1] if rep else None,
                    "report_via": rep[2] if rep and len(rep) > 2 else "",
                    "insecure_broker": bool(rep and getattr(rep[0], "insecure_broker", False)),
                    "decision": report_decision(rep[0], now) if rep else None,
                }
            )
        plot = plots.lines(*self._epsilon_series(now), y_label="Σ ε per vector")
        return self._page(
            ctx,
            "devices.html",
            {
                "rows": rows,
                "plot": Markup(plot),
                "watched": self.device_status,
                "reported": self.device_reports,
                "insecure": [r["id"] for r in rows if r["insecure_broker"]],
            },
        )

    def _epsilon_series(self, now: float) -> tuple[str, list[str], dict[str, list[float]]]:
        """The Devices chart: cumulative ε per vector per device over the last 7 days of the ledger.

        Buckets fit the span of the data (a minute for a run of an hour or two, an hour for a day or more),
        each series starting from 0 one bucket before its first release, so even one bucket of data draws
        a line.
        """
        since = now - 7 * 86400
        span = self.store.ledger_span(since)
        title = "ε per vector spent per device, templates + soft traits + labels (cumulative, last 7 days, UTC)"
        if span is None:
            return title, [], {}
        width = next((w for limit, w in EPSILON_BUCKETS if span[1] - span[0] <= limit), 86_400.0)
        per = self.store.epsilon_by_device_hour(since, bucket_s=width)
        first, last = min(b for _, b, _ in per), max(b for _, b, _ in per)
        buckets = list(range(first - 1, last + 1))
        if len(buckets) > 400:  # sparse data over a long span: only the buckets with releases, and the one before
            buckets = sorted({b for _, b, _ in per} | {first - 1})
        series: dict[str, list[float]] = {}
        for dev in sorted({d for d, _, _ in per}):
            by_b = {b: e for d, b, e in per if d == dev}
            total, vals = 0.0, []
            for b in buckets:
                total += by_b.get(b, 0.0)
                vals.append(total)
            series[dev] = vals
        fmt = "%H:%M" if width < 3600 else ("%d %Hh" if width < 86_400 else "%m-%d")
        labels = [datetime.fromtimestamp((b + 1) * width, UTC).strftime(fmt) for b in buckets]
        return title, labels, series

    # ------------------------------------------------------------ People

    def _kept(self) -> dict[str, Any]:
        """What the database keeps, per category, with how long (the People and Privacy pages)."""
        from peep.server.services import kept_rows

        cfg = self.services.config
        counts = self.services.store.kept_counts(cfg.training.background_prefix)
        return {"rows": kept_rows(cfg, counts), "keep": cfg.recognition.keep, "counts": counts}

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
                "kept": self._kept(),
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

    # ------------------------------------------------------------ Models

    def _versions(self) -> list[dict[str, Any]]:
        reg = self.services.registry
        current = reg.current_name()
        out = []
        for name in reg.versions():
            try:
                meta = reg.get(name).meta
            except Exception:  # a version deleted meanwhile (pruned, purged by an erasure)
                continue
            metrics = meta.get("metrics", {}) or {}
            out.append(
                {
                    "name": name,
                    "current": name == current,
                    "trained_at": float(meta.get("trained_at", meta.get("created_at", 0.0)) or 0.0),
                    "accuracy": metrics.get("validation_accuracy"),
                    "unknown_threshold": meta.get("unknown_threshold"),
                    "verify_threshold": meta.get("verify_threshold"),
                    "target_far": meta.get("target_far"),
                    "n_subjects": meta.get("n_subjects"),
                    "n_templates": meta.get("n_templates"),
                    "kinds": ", ".join(meta.get("mechanism_kinds", [])),
                    "bundle_id": meta.get("bundle_id", ""),
                }
            )
        return out

    def models(self, ctx: Ctx, *, message: str = "", status: int = 200) -> Response:
        from peep.server.recognition.presets import PRESETS

        versions = self._versions()
        plot = plots.bars(
            "Validation accuracy per model version",
            [v["name"] for v in versions],
            [float(v["accuracy"] or 0.0) for v in versions],
            y_label="accuracy",
            y_max=1.0,
        )
        t = self.services.trainer
        return self._page(
            ctx,
            "models.html",
            {
                "versions": versions,
                "plot": Markup(plot),
                "training": t.training,
                "progress": t.progress,
                "last_error": t.last_error,
                "last_run": max((v["trained_at"] for v in versions), default=None),
                "presets": list(PRESETS),
                "default_preset": self.services.config.training.preset,
                "device_models": issued_view(self.services, time.time()),
                "message": message,
            },
            status,
        )

    def model_status(self, ctx: Ctx) -> Response:
        t = self.services.trainer
        m = self.services.recogniser.model
        return JSONResponse(
            {
                "training": t.training,
                "progress": round(float(t.progress), 4),
                "last_error": shown(t.last_error) if t.last_error else None,
                "model_version": m.version if m else None,
            }
        )

    def train(self, ctx: Ctx) -> Response:
        from peep.server.recognition.presets import PRESETS

        preset = ctx.form.get("preset", "") or None
        if preset is not None and preset not in PRESETS:
            self._audit(ctx, "train", preset[:64], "refused: unknown preset")
            return self.models(
                ctx, message=f"preset: expected one of {sorted(PRESETS)}, received {preset[:64]!r}", status=400
            )
        started = self.services.trainer.start_background(preset)
        self._audit(ctx, "train", preset or self.services.config.training.preset, "started" if started else "busy")
        msg = "training started" if started else "a training run is already in progress"
        return self.models(ctx, message=msg, status=202 if started else 409)

    def make_current(self, ctx: Ctx) -> Response:
        """Serve a kept version again: roll back to an older one (or forward to a newer one)."""
        name = ctx.form.get("version", "")[:32]
        try:
            served = self.services.make_current(name)
        except ValueError as exc:
            self._audit(ctx, "make-current", name, f"refused: {exc}"[:200])
            return self.models(ctx, message=str(exc), status=409)
        self._audit(ctx, "make-current", served, "serving")
        return self.models(ctx, message=f"{served} is serving")

    # ------------------------------------------------------------ Privacy

    def privacy(self, ctx: Ctx) -> Response:
        from peep.core.mechanisms import mechanism_class

        mechanisms: dict[tuple[str, float, float], list[str]] = {}
        for d in self.store.devices():
            mechanisms.setdefault((d.mechanism_kind, d.epsilon_coordinate, d.epsilon_vector), []).append(d.device_id)
        rows = []
        for (kind, e_c, e_v), devs in sorted(mechanisms.items()):
            try:
                summary = str(getattr(mechanism_class(kind), "summary", ""))
            except (KeyError, ValueError):
                summary = ""
            rows.append({"kind": kind, "eps_coord": e_c, "eps_vector": e_v, "devices": devs, "summary": summary})
        audit = self._audit_summary()
        odometer = []
        if self.qbbs is not None:
            prefix = self.services.config.training.background_prefix
            for s, _, _ in self.store.subjects(limit=200):
                if s.startswith(prefix):
                    continue
                try:
                    odometer.append(self.qbbs.odometer(s))
                except Exception:  # a subject with no soft traits
                    continue
        bundle = self.services.bundles.current()
        return self._page(
            ctx,
            "privacy.html",
            {
                "mechanisms": rows,
                "audit": audit,
                "odometer": odometer,
                "qbbs": self.qbbs is not None,
                "bundle_id": bundle.bundle_id if bundle else "",
                "bundle_mechanism": getattr(bundle, "mechanism_defaults", None) if bundle else None,
                "kept": self._kept(),
            },
        )

    def _audit_summary(self) -> dict[str, Any] | None:
        d = self.cfg.audit_dir
        if d is None:
            return None
        path = d / "audit.json"
        try:
            if path.stat().st_size > 20_000_000:
                return {"path": str(path), "error": "audit.json is larger than 20 MB; not read"}
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return {"path": str(path), "error": f"not readable ({type(exc).__name__})"}
        results = data.get("results", []) if isinstance(data, dict) else []
        rows = []
        for r in results[:50]:
            if isinstance(r, dict):
                rows.append({k: r.get(k) for k in ("mechanism", "epsilon", "epsilon_vector", "accuracy")})
        return {"path": str(path), "rows": rows, "config": data.get("config", {}) if isinstance(data, dict) else {}}

    @staticmethod
    def _text(ctx: Ctx, key: str, limit: int = 64) -> str:
        value = ctx.request.query_params.get(key, "")
        if len(value) > limit or not value.isprintable():
            raise Refused(400, f"{key}: expected at most {limit} printable characters, received {value[:limit]!r}")
        return value

    def audit_page(self, ctx: Ctx) -> Response:
        actor, action, outcome = self._text(ctx, "actor"), self._text(ctx, "action"), self._text(ctx, "outcome")
        before = self._number(ctx, "before")
        entries = self.store.audit_log(limit=AUDIT_PAGE, actor=actor, action=action, outcome=outcome, before_id=before)
        query = {"actor": actor, "action": action, "outcome": outcome}
        older = _query({**query, "before": str(entries[-1].id)}) if len(entries) == AUDIT_PAGE else None
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
                "newest": _query(query) if before is not None else None,
            },
        )

    # ------------------------------------------------------------ Enrolment desk

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
