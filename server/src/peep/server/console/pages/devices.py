"""Devices: every device known by its configuration, its releases, its status or its report, with
its decision mode and model, and the ε each has spent over time."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from markupsafe import Markup
from peep.server.console import plots
from peep.server.console.devicemodels import report_decision
from peep.server.console.http import Ctx
from peep.server.console.pages.base import Page
from peep.server.console.render import transports_by_use
from starlette.responses import Response
from starlette.routing import Route

#: The Devices chart's buckets: (longest span of data, bucket width) in seconds, the first that fits.
EPSILON_BUCKETS: tuple[tuple[float, float], ...] = ((2 * 3600, 60.0), (12 * 3600, 600.0), (3 * 86_400, 3600.0))


class DevicesPage(Page):
    """The routes and handlers of this page (the rules every request passes are the app's)."""

    def routes(self) -> list[Route]:
        r = self.app.route
        return [
            Route("/devices", r(self.devices, "view"), methods=["GET"]),
        ]

    def devices(self, ctx: Ctx) -> Response:
        summaries = {d.device_id: d for d in self.store.devices()}
        configured = {d.id: d for d in self.services.config.auth.devices}
        status = self.app.device_status() if self.app.device_status else {}
        reports = self.app.device_reports() if self.app.device_reports else {}
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
                    "status": st[0] if st else ("never seen" if self.app.device_status else "not watched"),
                    "status_since": st[1] if st else None,
                    # How the status was learnt, when the source says; never assumed.
                    "status_via": st[2] if st and len(st) > 2 else "",
                    "s": s,
                    "transports": transports_by_use(s.transports) if s else [],
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
                "watched": self.app.device_status,
                "reported": self.app.device_reports,
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
