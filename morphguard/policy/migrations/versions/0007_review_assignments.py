"""Who is reviewing a flagged answer: a reviewer takes an item so that two do not judge it at once.

One row per decision taken, its own table (the decisions table holds what the proxy decided, never review state).
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.create_table(
        "assignments",
        sa.Column("decision_id", sa.Integer, primary_key=True),
        sa.Column("reviewer", sa.Text, nullable=False),
        sa.Column("time", sa.Text, nullable=False),
        sa.Index("assignments_reviewer", "reviewer"),
    )
