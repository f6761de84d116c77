"""The policies themselves, each registered by name (``greedy``, ``on-demand``, ``uniform-progress``,
``spotwise-rule``, ``spotwise``, ``spotwise-value`` and the real runs' ``spot-fallback``), with the
decision table the value policy reads. May import the policies' shared modules (``base``, ``lanes``,
``spells``); never the simulator."""
