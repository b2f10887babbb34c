"""Reviews (people's judgements of decisions) and text retention for review.

`reviews` holds one row per judgement; `decisions.text_kept_until` says until when a decision keeps its
full text for review (`policy.audit.keep_text`), which `morphguard audit --purge` then reduces.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.add_column("decisions", sa.Column("text_kept_until", sa.Text))
    op.create_index("decisions_score", "decisions", ["score", "id"])
    op.create_index("decisions_text_kept", "decisions", ["text_kept_until"])
    op.create_table(
        "reviews",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("time", sa.Text, nullable=False),
        sa.Column("decision_id", sa.Integer, nullable=False),
        sa.Column("request_id", sa.Text, nullable=False),
        sa.Column("reviewer", sa.Text, nullable=False),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("factoids", sa.JSON),
        sa.Column("note", sa.Text),
    )
    op.create_index("reviews_decision", "reviews", ["decision_id"])
