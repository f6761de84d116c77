"""How often a part of the run does its periodic work: each part owns its own clock.

The orchestrator's tick runs a few times a second; billing, node checks, the join watch, the job's
status and the policy each have their own period. Each is an :class:`Every` held by the part that
does the work (the purse bills, the fleet checks its nodes, ...), so the tick asks the part
whether it is time rather than keeping one ``last_*`` variable per concern.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Every:
    """A period of ``period_s`` seconds. :meth:`due` is True once per period (the first call
    always: nothing was done yet) and starts the next period at the ``now`` it was given."""

    period_s: float
    last: float = 0.0

    def due(self, now: float) -> bool:
        if now - self.last >= self.period_s:
            self.last = now
            return True
        return False
