"""The review queue's and the purge's indexes hold only the rows those read: scored rows, rows keeping their text.
An unchecked request's row then writes no page of either index.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    for name, columns, condition in (("decisions_score", ["score", "id"], "score IS NOT NULL"),
                                     ("decisions_text_kept", ["text_kept_until"], "text_kept_until IS NOT NULL")):
        op.drop_index(name, table_name="decisions")
        op.create_index(name, "decisions", columns, sqlite_where=sa.text(condition),
                        postgresql_where=sa.text(condition))
