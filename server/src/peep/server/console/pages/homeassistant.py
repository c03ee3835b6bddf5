"""Home Assistant: the state of the MQTT discovery the server publishes (``[home_assistant]``): whether it is on, the
entities announced, the devices left out and why, what was removed, the events sent, the last publish and the last
error; and, as on the Devices page, the ε each shown device has spent, which Home Assistant's events add nothing to.
"""

from __future__ import annotations

from typing import Any

from peep.server.console.http import Ctx
from peep.server.console.pages.base import Page
from starlette.responses import Response
from starlette.routing import Route


def _entity(topic: str, prefix: str) -> dict[str, str]:
    """A configuration topic taken apart: ``<prefix>/<component>/<node>/<object>/config``."""
    levels = topic[len(prefix) + 1 :].split("/") if topic.startswith(prefix + "/") else []
    if len(levels) != 4:
        return {"topic": topic, "component": "", "node": "", "object": ""}
    return {"topic": topic, "component": levels[0], "node": levels[1], "object": levels[2]}


class HomeAssistantPage(Page):
    """The routes and handlers of this page (the rules every request passes are the app's)."""

    def routes(self) -> list[Route]:
        r = self.app.route
        return [
            Route("/home-assistant", r(self.home_assistant, "view"), methods=["GET"]),
        ]

    def home_assistant(self, ctx: Ctx) -> Response:
        cfg = self.services.config
        publisher = self.app.home_assistant() if self.app.home_assistant is not None else None
        state = publisher.state() if publisher is not None else None
        devices: list[dict[str, Any]] = []
        if state is not None:
            # The ε the decisions Home Assistant hears of cost, as the Devices page counts it (the ingest ledger):
            # the devices spent it releasing; the events and counts derived from the decisions spend nothing more.
            spent = {d.device_id: d for d in self.store.devices()}
            for d in state.devices:
                s = spent.get(d.device_id)
                devices.append({
                    "id": d.device_id,
                    "site": d.site,
                    "kind": "door" if d.door else "camera",
                    "epsilon": s.epsilon_vector_total if s is not None else None,
                    "releases": s.releases if s is not None else 0,
                    "recent": state.recognised_recently.get(f"{d.site}/{d.device_id}"),
                })  # fmt: skip
        return self._page(
            ctx,
            "home_assistant.html",
            {
                "enabled": cfg.home_assistant.enabled,
                "mqtt_enabled": cfg.mqtt.enabled,
                "prefix": cfg.home_assistant.discovery_prefix,
                "recent_minutes": cfg.home_assistant.recent_minutes,
                "state": state,
                "entities": [_entity(t, state.prefix) for t in state.entities] if state is not None else [],
                "devices": devices,
            },
        )
