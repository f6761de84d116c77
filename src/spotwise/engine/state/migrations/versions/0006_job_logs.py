"""The job's own output: every line the driver and the ranks printed, in order.

One row per line (``seq`` per job, unique with it: the order and the API's cursor), with the rank
and node that printed it and its stream. See :mod:`spotwise.engine.run.joblogs`.

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a database made by ``create_all`` from newer models (stamped at 0001) may have it already
    if "job_logs" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "job_logs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("rank", sa.String(16), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("stream", sa.String(8), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.UniqueConstraint("job_id", "seq", name="uq_job_logs_job_seq"),
    )


def downgrade() -> None:
    op.drop_table("job_logs")
