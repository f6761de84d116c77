"""The service's own work over runs: jobs recorded and run in a process of their own (``jobs``,
``runner``), schedules, budgets and ``resume``. The engine's top: may import run, plan, state and
display."""
