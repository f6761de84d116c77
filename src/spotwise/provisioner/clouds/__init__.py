"""The clouds, one package each (``aws``, ``gcp``, ``azure``, ``local``, ``slurm``): everything of one cloud
(its :class:`~spotwise.provisioner.base.Cloud`, network, identity, market, discovery, batch script) lives
in its package. Each registers its ``Cloud`` by name (:data:`~spotwise.provisioner.base.CLOUDS` finds them
by importing this package tree), so adding a cloud is a new folder here and no central list. A cloud
may import :mod:`spotwise.provisioner` (the shared parts), :mod:`spotwise.provisioner.boot`, pricing and
the base modules; never another cloud (Slurm reuses the local cloud's process marker, the one exception)."""
