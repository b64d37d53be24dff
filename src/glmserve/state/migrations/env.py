"""Alembic's environment for the state database: migrations run on the connection that
``state.database.open_database`` passes in ``config.attributes["connection"]`` (online only)."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None)
with context.begin_transaction():
    context.run_migrations()
