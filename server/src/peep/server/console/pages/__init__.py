"""The console's pages, one module each: its routes and handlers (:class:`~peep.server.console.pages.base.Page`).

To add a page: a module here with a :class:`Page` subclass whose ``routes()`` wraps each handler with
``self.app.route(handler, permission)``, its template in ``console/templates``, and the class in
:data:`PAGES`; the rules every request passes are the app's and apply to it unchanged.
"""

from __future__ import annotations

from peep.server.console.pages.audit import AuditPage
from peep.server.console.pages.base import Page
from peep.server.console.pages.devices import DevicesPage
from peep.server.console.pages.enrol import EnrolPage
from peep.server.console.pages.homeassistant import HomeAssistantPage
from peep.server.console.pages.live import LivePage
from peep.server.console.pages.models import ModelsPage
from peep.server.console.pages.people import PeoplePage
from peep.server.console.pages.privacy import PrivacyPage
from peep.server.console.pages.session import SessionPages

#: Every page the console serves, in the order their routes are matched.
PAGES: tuple[type[Page], ...] = (
    SessionPages, LivePage, DevicesPage, PeoplePage, ModelsPage, PrivacyPage, HomeAssistantPage, AuditPage, EnrolPage,
)  # fmt: skip

__all__ = ["PAGES", "Page"]
