"""Whether an answer went out although the check it was due could not decide on it (`on_error: fail_open`). NULL:
a row written before this was recorded.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.add_column("decisions", sa.Column("unchecked", sa.Boolean))
