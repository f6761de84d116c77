"""The orchestrator: owns a run end to end (plan, launch, train, react, bill, report) and its
state in a database (SQLite by default, PostgreSQL for a shared server)."""
