"""The operator console: a web page for deployers, served by ``peep serve``.

Pages: *Live* (recognitions as they happen, unknown-face alerts to acknowledge), *Devices* (status, releases,
ε spent), *People* (enrolled subjects, erasure), *Models* (versions, accuracy, thresholds, training),
*Privacy* (mechanisms and both ε values, the audit, the QBBS odometer), *Home Assistant* (what the discovery
publishes, what it left out, its errors), *Enrolment* (the enrolment desk) and the console's *Audit log*. No page
shows an image: the server has none.

Why Starlette + Jinja2 on uvicorn
---------------------------------
The console is server-rendered HTML with one small static script (server-sent events for Live, a progress
poll for training), so it needs routing, forms, cookies, a streaming response and templates, and nothing
that needs a front-end build. Starlette is a small, maintained ASGI toolkit (the base of FastAPI) that
gives exactly those without an ORM, an admin or its own auth to work around; Jinja2 (already installed
with the server's dependencies) autoescapes; uvicorn serves it over TLS in a thread of the ``peep serve``
process, beside gRPC, so the console calls the same :class:`~peep.server.services.Services` objects the
gRPC API does. Django would bring a second ORM and settings system; Flask would need a separate WSGI
server and a thread per event stream. The extra ``peep-server[console]`` installs the three packages;
without it ``peep serve`` with a ``[console]`` section fails at start naming the extra.

Modules: :mod:`~peep.server.console.accounts` (roles, scrypt, throttling), :mod:`~.store` (its tables),
:mod:`~.feed` (the live events), :mod:`~.plots` (SVG), :mod:`~.text` (showing untrusted text),
:mod:`~.web` (the application and the rules each request passes), :mod:`~.server` (the HTTPS listener),
:mod:`~.connections` (its deadline for requests and its connection limits, against slow clients).
"""

from __future__ import annotations

from typing import Any


def require_console() -> None:
    """Raise :class:`~peep.server.errors.UsageError` (exit 2) naming the extra when the web packages are missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
        import zxcvbn  # noqa: F401  (the strength of the passwords operators choose)
    except ModuleNotFoundError as exc:
        from peep.server.errors import UsageError

        raise UsageError(
            f"console: the operator console needs the extra peep-server[console] ({exc.name} is not installed): "
            "pip install 'peep-server[console]'"
        ) from None


def start_console(
    services: Any,
    *,
    qbbs: Any = None,
    device_status: Any = None,
    device_reports: Any = None,
    home_assistant: Any = None,
) -> Any:
    """Build and start the console for ``services`` (``services.config.console`` must be set).

    Returns the running :class:`~peep.server.console.server.ConsoleServer` (``.url``, ``.port``, ``.stop()``).
    Raises :class:`~peep.server.errors.UsageError` (exit 2) naming the extra when the web packages are not
    installed.
    """
    require_console()
    from peep.server.console.pages import PAGES
    from peep.server.console.server import ConsoleServer
    from peep.server.console.web import ConsoleApp

    app = ConsoleApp(services, pages=PAGES, qbbs=qbbs, device_status=device_status, device_reports=device_reports,
                     home_assistant=home_assistant)  # fmt: skip
    try:
        return ConsoleServer(app).start()
    except BaseException:
        app.close()
        raise
