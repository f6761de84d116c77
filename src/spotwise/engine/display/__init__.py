"""How a run reads to a person: the redrawn progress lines (``progress``), events as sentences
(``sentences``) and the final summary (``summary``). Imports the engine's plan and state only."""
