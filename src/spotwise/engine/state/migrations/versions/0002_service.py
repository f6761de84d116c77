"""The service's tables: budgets and reservations, schedules and their runs, API tokens; and the
append-only guard on the spend ledger (PostgreSQL: a trigger refuses UPDATE/DELETE on ``ledger``).

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("cap_usd", sa.Float(), nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "budget_reservations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("budget_id", sa.String(128), sa.ForeignKey("budgets.id", ondelete="CASCADE"), nullable=False),
        sa.Column("period_key", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("amount_usd", sa.Float(), nullable=False),
        sa.Column("actual_usd", sa.Float(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("settled_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_budget_reservations_budget_id", "budget_reservations", ["budget_id"])
    op.create_index("ix_budget_reservations_period_key", "budget_reservations", ["period_key"])
    op.create_index("ix_budget_reservations_job_id", "budget_reservations", ["job_id"])
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("task", sa.JSON(), nullable=False),
        sa.Column("cron", sa.String(128), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("budget_per_run", sa.Float(), nullable=True),
        sa.Column("budget_per_month", sa.Float(), nullable=True),
        sa.Column("deadline_hours", sa.Float(), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("overlap", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_fire_at", sa.Float(), nullable=True),
    )
    op.create_table(
        "schedule_runs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.String(64), sa.ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
        sa.Column("fire_at", sa.Float(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("reservation_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("schedule_id", "fire_at", name="uq_schedule_run_fire"),
    )
    op.create_index("ix_schedule_runs_schedule_id", "schedule_runs", ["schedule_id"])
    op.create_index("ix_schedule_runs_status", "schedule_runs", ["status"])
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute("""
            CREATE OR REPLACE FUNCTION spotwise_ledger_append_only() RETURNS trigger AS $$
            BEGIN
              RAISE EXCEPTION 'the spend ledger is append-only (% refused)', TG_OP;
            END $$ LANGUAGE plpgsql""")
        op.execute("""CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
                      FOR EACH ROW EXECUTE FUNCTION spotwise_ledger_append_only()""")
    else:
        op.execute("""CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger
                      BEGIN SELECT RAISE(ABORT, 'the spend ledger is append-only (UPDATE refused)'); END""")
        op.execute("""CREATE TRIGGER ledger_no_delete BEFORE DELETE ON ledger
                      BEGIN SELECT RAISE(ABORT, 'the spend ledger is append-only (DELETE refused)'); END""")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS ledger_append_only ON ledger")
        op.execute("DROP FUNCTION IF EXISTS spotwise_ledger_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS ledger_no_update")
        op.execute("DROP TRIGGER IF EXISTS ledger_no_delete")
    for t in ("api_tokens", "schedule_runs", "schedules", "budget_reservations", "budgets"):
        op.drop_table(t)
