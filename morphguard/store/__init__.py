"""Durable state shared by the parts of a deployment, each behind one small interface.

- `database`: the SQL engine behind the audit trail and escalation outbox (SQLite or PostgreSQL by URL,
  schema migrations with Alembic); the tables themselves belong to `policy.audit`.
- `queue`: the async check queue (`CheckQueue`): SQLite for one process, Redis Streams for a fleet.
- `verdicts`: the verdict cache a fleet shares (Redis, with a TTL).
"""
