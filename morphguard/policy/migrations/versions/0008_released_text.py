"""What a stream checked as it flows released before its verdict: the characters of answer text the client
received (`released_chars`) and the score and flag of the check that text passed. NULL: not such a stream.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.add_column("decisions", sa.Column("released_chars", sa.Integer))
    op.add_column("decisions", sa.Column("released_score", sa.Float))
    op.add_column("decisions", sa.Column("released_flagged", sa.Boolean))
