"""Trace-driven simulation: one job under a policy (``simulator``), across regions (``multiregion``),
the omniscient oracle every policy is measured against (``omniscient``) and the summary ``spotwise
simulate`` prints (``evaluate``). May import the shared modules and the rules."""
