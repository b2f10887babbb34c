"""The audit trail and escalation outbox as morphguard wrote them before migrations existed.

A SQLite store made by an earlier version already has these tables, maybe without the columns added
since: they are created if absent and completed if short, so old stores join the migration history.
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None

def decisions_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("time", sa.Text), sa.Column("request_id", sa.Text), sa.Column("trace_id", sa.Text),
        sa.Column("profile", sa.Text), sa.Column("route", sa.Text), sa.Column("model", sa.Text),
        sa.Column("topic", sa.Text), sa.Column("checked", sa.Boolean), sa.Column("score", sa.Float),
        sa.Column("threshold", sa.Float), sa.Column("flagged", sa.Boolean), sa.Column("action", sa.Text),
        sa.Column("escalated", sa.Boolean), sa.Column("reason", sa.Text), sa.Column("detector", sa.Text),
        sa.Column("factoids", sa.JSON), sa.Column("cost", sa.JSON), sa.Column("question", sa.Text),
        sa.Column("answer", sa.Text), sa.Column("context", sa.Text), sa.Column("context_source", sa.Text),
        sa.Column("latency_ms", sa.Integer), sa.Column("regenerations", sa.Integer),
    ]


def upgrade() -> None:
    op.create_table("decisions", sa.Column("id", sa.Integer, primary_key=True), *decisions_columns(),
                    if_not_exists=True)
    present = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("decisions")}
    for column in decisions_columns():
        if column.name not in present:
            op.add_column("decisions", column)
    op.create_index("decisions_time", "decisions", ["time"], if_not_exists=True)
    op.create_index("decisions_request", "decisions", ["request_id"], if_not_exists=True)
    op.create_table(
        "escalations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("time", sa.Text, nullable=False),
        sa.Column("request_id", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),  # pending | delivered | undelivered
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error", sa.Text),
        sa.Column("payload", sa.Text, nullable=False),
        if_not_exists=True)
    op.create_index("escalations_state", "escalations", ["state"], if_not_exists=True)
