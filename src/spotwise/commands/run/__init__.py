"""Commands that run or inspect a run and its cluster: ``launch``, ``resume``, ``status``, ``logs``,
``up``, ``down``, ``gc`` and the live display launch and resume draw (``live``). Registered like
every command; may import the engine, the provisioner and the base modules."""
