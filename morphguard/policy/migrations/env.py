"""Alembic's entry point for the audit store's schema; `store.database.migrate` hands it a connection.

New revision (a field added to DecisionRecord, a new table): `alembic -c morphguard/policy/migrations/alembic.ini
revision -m "..."`, then write its upgrade by hand; tests/store/test_schema.py fails until the migrated
schema equals `policy.audit.metadata` on SQLite and on PostgreSQL.
"""

from alembic import context

from morphguard.policy.audit import metadata

connection = context.config.attributes["connection"]
# batch mode: SQLite cannot alter most column properties in place; Alembic copies the table instead.
context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
