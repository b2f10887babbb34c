"""When an undelivered escalation is tried again: escalations outlive a webhook outage.

NULL: never again (delivered, or given up after `policy.escalation.retry_for_s`).
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.add_column("escalations", sa.Column("retry_at", sa.Float))
