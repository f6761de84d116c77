"""Planning a run before anything launches: what was asked (``options`` and their checks) and the
ranked offers (``planner``). Imports pricing, policies, the provisioner, the runtime's contract and
the engine's state; never the run."""
