"""The gateway that asked about an answer and what morphguard told it (`portkey:deny`, `litellm:pass`,
`nemo:failed`, ...). NULL: a request morphguard's own proxy answered.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.add_column("decisions", sa.Column("gateway", sa.Text))
