"""The engine's state in its database: models and engine (``db``), migrations (``migrate``,
``migrations/``), the ledger, the runner's lease, the spot log, and the reads others need
(``store``, ``records``, ``reports``). The engine's leaf: imports no other engine package."""
