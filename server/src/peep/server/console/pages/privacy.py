"""Privacy: the mechanisms and ε the devices release with, the QBBS odometer, the latest audit's
figures and what the database keeps."""

from __future__ import annotations

import json
from typing import Any

from peep.server.console.http import Ctx
from peep.server.console.pages.base import Page
from starlette.responses import Response
from starlette.routing import Route


class PrivacyPage(Page):
    """The routes and handlers of this page (the rules every request passes are the app's)."""

    def routes(self) -> list[Route]:
        r = self.app.route
        return [
            Route("/privacy", r(self.privacy, "view"), methods=["GET"]),
        ]

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
        if self.app.qbbs is not None:
            prefix = self.services.config.training.background_prefix
            for s, _, _ in self.store.subjects(limit=200):
                if s.startswith(prefix):
                    continue
                try:
                    odometer.append(self.app.qbbs.odometer(s))
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
                "qbbs": self.app.qbbs is not None,
                "bundle_id": bundle.bundle_id if bundle else "",
                "bundle_mechanism": getattr(bundle, "mechanism_defaults", None) if bundle else None,
                "kept": self.kept(),
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
