"""Imports every built-in policy module so that each registers itself."""

from spotwise.policies import fallback  # noqa: F401
from spotwise.policies import greedy, omniscient, on_demand, spotwise_policy, survival_policy, uniform_progress, value_policy  # noqa: F401
