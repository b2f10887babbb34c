"""One decision per request id: the audit write is idempotent (INSERT ... ON CONFLICT DO NOTHING).

A check delivered twice (a worker that lost its queue acknowledgement, a claim taken over while the
first worker still ran) then leaves one row, and one escalation, not two. Rows a store already holds twice
are kept: every copy after the first gets `#dup<row id>` appended to its request id, so nothing recorded is
lost and the unique index can be built.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    decisions = sa.table("decisions", sa.column("id", sa.Integer), sa.column("request_id", sa.Text))
    first = (sa.select(sa.func.min(decisions.c.id)).where(decisions.c.request_id.is_not(None))
             .group_by(decisions.c.request_id).scalar_subquery())
    duplicated = (sa.select(decisions.c.request_id).group_by(decisions.c.request_id)
                  .having(sa.func.count() > 1).scalar_subquery())
    suffix = sa.literal("#dup") + sa.cast(decisions.c.id, sa.Text)
    op.execute(decisions.update()
               .where(decisions.c.request_id.in_(duplicated), decisions.c.id.not_in(first))
               .values(request_id=decisions.c.request_id + suffix))
    op.drop_index("decisions_request", "decisions")
    op.create_index("decisions_request", "decisions", ["request_id"], unique=True)
