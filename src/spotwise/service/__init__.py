"""The HTTP service (``spotwise serve``): API, dashboard, metrics, auth and the scheduler, over the run
engine (:mod:`spotwise.engine`). Routes stay thin: what a route answers is a query or a command of the
engine, shared with the CLI.
"""
