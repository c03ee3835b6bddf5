"""Ingest: validation, authentication and rights, storing templates, recognition events.

The face others use: :mod:`~peep.server.ingest.ingestor` (``Ingestor``: raw payloads or parsed templates in,
one outcome each), :mod:`~peep.server.ingest.validation` (``TemplateValidator`` and its ``Rejection``),
:mod:`~peep.server.ingest.auth` (identities, the device registry, the gRPC interceptor),
:mod:`~peep.server.ingest.events` (the event bus and the events' JSON), :mod:`~peep.server.ingest.contacts` (when
each device was last heard) and :mod:`~peep.server.ingest.reports` (devices' reports). Each module's ``__all__``
names what it offers; anything else is the module's own (``tests/server/test_public_faces.py``).
"""

__all__ = ["auth", "contacts", "events", "ingestor", "reports", "validation"]
