"""Opening the configured store: SQLite or PostgreSQL (:func:`open_store`).

Apart from :mod:`~peep.server.storage.interface` (the contract both stores implement), which the stores import:
the one place that knows both of them.
"""

from __future__ import annotations

from peep.server.storage.interface import Store


def open_store(config: object, *, password: str | None = None, application_name: str = "peep-server") -> Store:
    """Open (and migrate) the store described by a :class:`~peep.server.config.StorageConfig`.

    ``application_name``: what PostgreSQL shows for this process's connections (``pg_stat_activity``),
    unless ``storage.dsn`` names one.
    """
    from peep.server.config import StorageConfig

    if not isinstance(config, StorageConfig):
        raise TypeError(f"config: expected a StorageConfig, received {type(config).__name__}")
    if config.backend == "sqlite":
        from peep.server.storage.sqlite import SqliteStore

        return SqliteStore(config.path)
    from peep.server.storage.postgres import PostgresStore

    return PostgresStore(config.dsn, password=password, pool_size=config.pool_size, application_name=application_name)
