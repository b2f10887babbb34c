"""What a shadow candidate made of a live request: one row per request it checked, beside the request's decision
(joined by request id), never an edit of it. `changed`: its action or flag differs from the live decision's.
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    op.create_table(
        "shadow_verdicts",
        sa.Column("request_id", sa.Text, primary_key=True),
        sa.Column("time", sa.Text, nullable=False),
        sa.Column("candidate", sa.Text, nullable=False),
        sa.Column("changed", sa.Boolean, nullable=False),
        sa.Column("action", sa.Text),
        sa.Column("outcome", sa.JSON, nullable=False),
        sa.Index("shadow_verdicts_changed", "changed"),
    )
