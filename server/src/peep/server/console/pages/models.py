"""Models: the kept versions, training runs, rolling back, and the models issued to devices."""

from __future__ import annotations

import time
from typing import Any

from markupsafe import Markup
from peep.server.console import plots
from peep.server.console.devicemodels import issued_view
from peep.server.console.http import Ctx
from peep.server.console.pages.base import Page
from peep.server.console.text import shown
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class ModelsPage(Page):
    """The routes and handlers of this page (the rules every request passes are the app's)."""

    def routes(self) -> list[Route]:
        r = self.app.route
        return [
            Route("/models", r(self.models, "view"), methods=["GET"]),
            Route("/models/status", r(self.model_status, "view", api=True), methods=["GET"]),
            Route("/models/train", r(self.train, "train"), methods=["POST"]),
            Route("/models/current", r(self.make_current, "train"), methods=["POST"]),
        ]

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
