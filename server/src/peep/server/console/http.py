"""The HTTP rules every console response follows: session and login cookies, body and stream limits, the
security headers (and redirects kept on the console), a refused request, a request as a handler sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from peep.server.console.store import Session
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = "__Host-peep_session"
LOGIN_COOKIE = "__Host-peep_login"
#: Largest request body accepted (forms only: the console takes no uploads).
MAX_BODY = 16 * 1024
MAX_FIELDS = 16
#: Live event streams open at once, per session and in all.
MAX_STREAMS_PER_SESSION = 4
MAX_STREAMS = 256
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
    (b"strict-transport-security", b"max-age=31536000"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
]


def _local_location(value: bytes) -> bytes:
    """A redirect's target as a path on this console.

    Starlette builds some redirects (a trailing slash, a static folder) from the request's ``Host``
    header, which the client chooses: a foreign ``Host`` would send the operator's browser to that host.
    A path resolves against the address the browser actually used.
    """
    parts = urlsplit(value.decode("latin-1"))
    if not parts.scheme and not parts.netloc:
        return value
    path = "/" + parts.path.lstrip("/")  # "//evil" is a host too
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")


class SecurityHeaders:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to every response (static files and errors too), and
    keeping every redirect on the console (:func:`_local_location`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, _local_location(v) if k.lower() == b"location" else v)
                           for k, v in message.get("headers", [])]  # fmt: skip
                names = {k.lower() for k, _ in headers}
                message["headers"] = headers + [h for h in SECURITY_HEADERS if h[0] not in names]
            await send(message)

        await self.app(scope, receive, send_with_headers)


class Refused(Exception):
    """A request refused with ``status`` and a message (shown escaped).

    ``session`` is set once the request's session is known, so the refusal is shown on a page with the
    account's navigation.
    """

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.session: Session | None = None
        super().__init__(message)


@dataclass
class Ctx:
    """One request as a handler sees it."""

    request: Request
    session: Session | None
    form: dict[str, str] = field(default_factory=dict)
    address: str = ""
    session_id: str = ""

    @property
    def actor(self) -> str:
        return self.session.name if self.session else "-"
