"""A curve point's speed: ``tokens_per_s``, ``mfu`` and ``peak_memory_bytes`` beside step, loss and
spend (issue 49, item 6). See :mod:`spotwise.engine.run.curves`.

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

COLUMNS = ("tokens_per_s", "mfu", "peak_memory_bytes")


def upgrade() -> None:
    # a database made by ``create_all`` from newer models (stamped at 0001) may have them already
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("curve_points")}
    with op.batch_alter_table("curve_points") as t:
        for name in COLUMNS:
            if name not in have:
                t.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("curve_points") as t:
        for name in COLUMNS:
            t.drop_column(name)
