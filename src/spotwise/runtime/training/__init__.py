"""The training itself: the Ray-free loop and its spec (``loop``, ``spec``, ``saving``), the optimizer,
its learning-rate schedule and the non-finite guard (``optim``), determinism (``determinism``), the
held-out loss (``evaluate``), sharding (``parallel``), the three ways in (``builtin``, ``usercode``,
``trainfunc``), Ray Train's side (``trainer``, ``session``) and the channels a running job keeps with
the orchestrator (``control``, ``joboutput``); ``standalone`` runs without Ray. May import the
runtime's contract (``api``, ``config``), weights, models, data, checkpoint and storage; never
``runtime.node``."""
