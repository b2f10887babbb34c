"""Each step that moved a check's score (a calibration, a cascade branch, a floor), with the score before and after,
for the review console. NULL: the detector recorded none.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.add_column("decisions", sa.Column("explanation", sa.JSON))
