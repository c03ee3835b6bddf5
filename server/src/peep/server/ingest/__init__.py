"""Ingest: validation, authentication and rights, storing templates, recognition events."""
