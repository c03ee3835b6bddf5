"""Live: the kept decisions (filtered, paged), their event stream, the unknown-face alerts and their
acknowledgement."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from markupsafe import Markup
from peep.core.wire import ID_PATTERN
from peep.server.console import accounts, plots
from peep.server.console.feed import LiveEvent
from peep.server.console.http import MAX_STREAMS, MAX_STREAMS_PER_SESSION, Ctx, Refused
from peep.server.console.pages.base import Page, choice, id_filter, local_back, number, query_string
from peep.server.console.render import time_text
from peep.server.console.store import DECISIONS, Recognition
from peep.server.console.text import shown
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

#: The Live page's time filter: how far back (seconds; 0: every decision kept).
PERIODS: dict[str, int] = {"1h": 3600, "24h": 86_400, "7d": 7 * 86_400, "all": 0}
RECOGNITIONS_PAGE = 50
ALERT_GROUPS_PAGE = 20
#: Unknown-face alerts are grouped per device and per this window (an hour reads as one line).
ALERT_WINDOW_S = 3600.0
#: "Acknowledge every alert older than …" (seconds, label); 0 acknowledges all of them.
ACK_AGES: tuple[tuple[int, str], ...] = ((3600, "older than an hour"), (86_400, "older than a day"), (0, "all"))


def _decision_of(e: Any) -> str:
    """What a feed event decided, in the Live filter's terms (:data:`~peep.server.console.store.DECISIONS`)."""
    if e.purpose == "verify":
        return "accepted" if e.accepted else "refused"
    return "unknown" if e.unknown else "named"


def _recognition(e: LiveEvent) -> Recognition:
    """A feed event as a kept decision is listed (not yet written: no id)."""
    return Recognition(
        0, e.event_id, e.time, e.site, e.device_id, e.track_id, e.purpose, e.subject, e.unknown, e.accepted,
        e.probability, e.model_version, e.requested_by,
    )  # fmt: skip


class LivePage(Page):
    """The routes and handlers of this page (the rules every request passes are the app's)."""

    def routes(self) -> list[Route]:
        r = self.app.route
        return [
            Route("/live", r(self.live, "view"), methods=["GET"]),
            Route("/live/events", self.events, methods=["GET"]),
            Route("/alerts/ack", r(self.acknowledge, "acknowledge"), methods=["POST"]),
        ]

    def live(self, ctx: Ctx) -> Response:
        site, device = id_filter(ctx, "site"), id_filter(ctx, "device")
        decision = choice(ctx, "decision", ("", *DECISIONS))
        period = choice(ctx, "period", tuple(PERIODS), "24h")
        before = number(ctx, "before")
        alert_page = number(ctx, "alerts") or 0
        now = time.time()
        since = now - PERIODS[period] if PERIODS[period] else None
        kept_sites, kept_devices = self.app.choices.get()
        feed_sites, feed_devices = self.app.feed.sites_and_devices()
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
                for e in self.app.feed.recent(site=site, device_id=device, limit=RECOGNITIONS_PAGE)
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
            older = query_string({**query, "before": str(events[-1].id)})
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
                "newest": query_string(query) if not first_page else None,
                "last_seq": self.app.feed.last_seq,
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

    async def events(self, request: Request) -> Response:
        """Server-sent events: each new recognition (filtered by ``site``/``device``) as one JSON message."""
        session, sid = await self.app.session_of(request)
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
        seq = int(after) if after.isdigit() and len(after) < 19 else self.app.feed.last_seq
        key = accounts.token_digest(sid)
        with self.app.streams_lock:
            mine = self.app.streams.get(key, 0)
            if mine >= MAX_STREAMS_PER_SESSION or sum(self.app.streams.values()) >= MAX_STREAMS:
                return PlainTextResponse(
                    f"event streams: at most {MAX_STREAMS_PER_SESSION} per session and {MAX_STREAMS} in all are open; "
                    "close a Live tab",
                    status_code=429,
                    headers={"retry-after": "10"},
                )
            self.app.streams[key] = mine + 1

        async def stream() -> Any:
            try:
                async for chunk in _stream():
                    yield chunk
            finally:
                with self.app.streams_lock:
                    left = self.app.streams.get(key, 1) - 1
                    if left > 0:
                        self.app.streams[key] = left
                    else:
                        self.app.streams.pop(key, None)

        async def _stream() -> Any:
            nonlocal seq
            last_beat = last_check = time.monotonic()
            yield "retry: 2000\n\n"
            while not self.app.stopping:
                if await request.is_disconnected():
                    return
                top = self.app.feed.last_seq
                for e in self.app.feed.since(seq, site=site, device_id=device):
                    data = {k: (shown(v) if isinstance(v, str) else v) for k, v in e.as_json().items()}
                    data["time_text"] = time_text(e.time)
                    yield f"id: {e.seq}\ndata: {json.dumps(data)}\n\n"
                seq = top
                now = time.monotonic()
                if now - last_beat > 15:
                    last_beat = now
                    yield ": keep-alive\n\n"
                if now - last_check > 30:  # a session ended elsewhere (logout, expiry) ends the stream
                    last_check = now
                    s, _ = await self.app.session_of(request)
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
                f"older than {f['older_than']} s" if "older_than" in f else f"{time_text(since)}–{time_text(before)}"
            )
            self._audit(ctx, "acknowledge-many", what, f"{n} alerts")
        back = f.get("back", "/live")
        return RedirectResponse(back if local_back(back, "/live") else "/live", status_code=303)
