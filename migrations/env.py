"""Alembic environment: the mirror's schema, upgraded by `anyrtd db upgrade`.

`target_metadata` is the schema declared in `anyrtd.mirror`, so that autogenerate compares
a migrated mirror with the tables in code (tests/test_mirror_schema.py keeps them equal).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from anyrtd.mirror import metadata

config = context.config
target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
        compare_server_default=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


run_migrations()
