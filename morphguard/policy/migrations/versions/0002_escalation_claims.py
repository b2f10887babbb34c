"""Escalation claims: which process is delivering a pending escalation, and since when it last tried.

With several replicas on one store, each escalation is delivered by the one replica that holds its claim;
a claim not renewed within `policy.escalation.claim_timeout_s` is taken over.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.add_column("escalations", sa.Column("claimed_by", sa.Text))
    op.add_column("escalations", sa.Column("claimed_at", sa.Float))
