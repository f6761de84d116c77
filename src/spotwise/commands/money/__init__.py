"""Commands about money before and after a run: ``prices``, ``catalog``, ``estimate``,
``cost-report`` and ``simulate`` (a policy over spot traces). Registered like every command; may
import pricing, policies and the engine's reads."""
