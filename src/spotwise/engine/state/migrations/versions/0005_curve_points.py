"""A run's curves: loss against step and spend against time, sampled as the run goes.

One row per sample of a running job (``step`` and ``loss`` as training last reported them, rank
0's; ``spend_usd`` what the ledger had billed and accrued by ``t``). See
:mod:`spotwise.engine.run.curves`.

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a database made by ``create_all`` from newer models (stamped at 0001) may have it already
    if "curve_points" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "curve_points",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("spend_usd", sa.Float(), nullable=False),
    )
    op.create_index("ix_curve_points_job_id", "curve_points", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_curve_points_job_id", table_name="curve_points")
    op.drop_table("curve_points")
