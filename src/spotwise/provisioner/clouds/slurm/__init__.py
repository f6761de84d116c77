"""Slurm: a cluster reached by its CLI locally or over ssh (``cli``), its partitions read as offers
(``discovery``, ``offers``), the batch script that starts Ray in ``srun`` steps (``script``), job
submission and state (``jobs``, ``launch``) and the ``Cloud`` over them. Imports the shared provisioner
(the ssh transport among it), its boot package and the local cloud's process marker."""
