"""Logging in and out and changing the password: the pages every account reaches, the one-time
password's included."""

from __future__ import annotations

from peep.server.console import accounts
from peep.server.console.accounts import Throttled
from peep.server.console.http import LOGIN_COOKIE, SESSION_COOKIE, Ctx
from peep.server.console.pages.base import Page
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route


class SessionPages(Page):
    """The routes and handlers of this page (the rules every request passes are the app's)."""

    def routes(self) -> list[Route]:
        r = self.app.route
        return [
            Route("/", r(self.home, None), methods=["GET"]),
            Route("/login", r(self.login_page, None, public=True), methods=["GET"]),
            Route("/login", r(self.login, None, public=True), methods=["POST"]),
            Route("/logout", r(self.logout, None, allow_must_change=True), methods=["POST"]),
            Route("/password", r(self.password_page, None, allow_must_change=True), methods=["GET"]),
            Route("/password", r(self.password, None, allow_must_change=True), methods=["POST"]),
        ]

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
            self.app.throttle.check(name, ctx.address)
        except Throttled as exc:
            self.store.audit(name or "-", "login", "", "throttled", ctx.address)
            return self.login_page(ctx, error=str(exc), status=429)
        account = self.store.account(name) if accounts.is_account_name(name) else None
        ok = accounts.verify_password(password, account.password_hash if account else None)
        if not ok or account is None or account.disabled:
            self.app.throttle.failed(name, ctx.address)
            self.store.audit(name or "-", "login", "", "failed", ctx.address)
            return self.login_page(ctx, error="wrong account name or password", status=401)
        self.app.throttle.succeeded(name)
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
