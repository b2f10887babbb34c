"""Review console sessions ended by logging out.

A session is a signed cookie, valid in every process that knows the secret; a logout writes the session's
id here, and every process refuses a session whose id is here, until the session's own end passes.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.create_table(
        "revoked_sessions",
        sa.Column("session_id", sa.Text, primary_key=True),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
