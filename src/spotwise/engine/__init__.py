"""The run engine: owns a run end to end (plan, launch, train, react, bill, report) and its state in a
database (SQLite by default, PostgreSQL for a shared server).

``spotwise launch`` uses it with no server; the HTTP service (:mod:`spotwise.service`) is a thin layer
over it. Nothing here imports the service.
"""
