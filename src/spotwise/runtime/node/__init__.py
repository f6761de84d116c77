"""What runs beside training on each node: the interruption watcher (``watch``) over the cloud
notice pollers (``notices``), the dead man's switch (``deadman``), and the job's driver on the head
(``job``). The top of the runtime: may import training and everything below it."""
