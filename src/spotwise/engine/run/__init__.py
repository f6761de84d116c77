"""One run, end to end: the :class:`~spotwise.engine.run.orchestrator.Orchestrator` and its parts: the
journal, the fleet of nodes, the Ray job's driver, the purse (billing, cap, lease), steering and
the market watch, joins, the run's stores, its curves and output, its signals. May import the
engine's plan, state and display packages; never ``engine.work``."""
