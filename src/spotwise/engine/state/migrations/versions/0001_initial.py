"""The orchestrator's tables as first shipped: jobs, nodes, ledger, events.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("cloud", sa.String(32), nullable=False),
        sa.Column("cluster_id", sa.String(64), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("budget_usd", sa.Float(), nullable=True),
        sa.Column("deadline_hours", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("steps_completed", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("resumes", sa.Integer(), nullable=False),
        sa.Column("final_checkpoint", sa.Text(), nullable=True),
        sa.Column("model_sha256", sa.String(64), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("owner_pid", sa.Integer(), nullable=True),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_index("ix_jobs_cluster_id", "jobs", ["cluster_id"])
    op.create_table(
        "nodes",
        sa.Column("instance_id", sa.String(128), primary_key=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("cluster_id", sa.String(64), nullable=False),
        sa.Column("cloud", sa.String(32), nullable=False),
        sa.Column("instance_type", sa.String(64), nullable=False),
        sa.Column("region", sa.String(64), nullable=False),
        sa.Column("zone", sa.String(64), nullable=False),
        sa.Column("market", sa.String(32), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("usd_per_hour", sa.Float(), nullable=False),
        sa.Column("price_source", sa.Text(), nullable=False),
        sa.Column("price_as_of", sa.String(32), nullable=False),
        sa.Column("launched_at", sa.Float(), nullable=False),
        sa.Column("billed_until", sa.Float(), nullable=False),
        sa.Column("terminated_at", sa.Float(), nullable=True),
        sa.Column("end_reason", sa.String(64), nullable=True),
    )
    op.create_index("ix_nodes_job_id", "nodes", ["job_id"])
    op.create_index("ix_nodes_cluster_id", "nodes", ["cluster_id"])
    op.create_table(
        "ledger",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("instance_id", sa.String(128), nullable=False),
        sa.Column("cloud", sa.String(32), nullable=False),
        sa.Column("market", sa.String(32), nullable=False),
        sa.Column("start", sa.Float(), nullable=False),
        sa.Column("end", sa.Float(), nullable=False),
        sa.Column("seconds", sa.Integer(), nullable=False),
        sa.Column("usd_per_hour", sa.Float(), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("price_source", sa.Text(), nullable=False),
        sa.Column("price_as_of", sa.String(32), nullable=False),
    )
    op.create_index("ix_ledger_job_id", "ledger", ["job_id"])
    op.create_index("ix_ledger_instance_id", "ledger", ["instance_id"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
    )
    op.create_index("ix_events_job_id", "events", ["job_id"])


def downgrade() -> None:
    for t in ("events", "ledger", "nodes", "jobs"):
        op.drop_table(t)
