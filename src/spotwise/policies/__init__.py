"""Spot / on-demand / wait decisions for a run with a deadline and a budget.

The same :class:`~spotwise.policies.base.Policy` objects drive the trace simulator and real runs
in the orchestrator; they need no cloud at all.
"""

from spotwise.policies.base import POLICIES, Decision, Observation, Policy, get_policy, known_policies, register_policy

__all__ = ["POLICIES", "Decision", "Observation", "Policy", "get_policy", "known_policies", "register_policy"]
