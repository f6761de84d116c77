"""The ``local`` cloud: Ray nodes as processes on this machine (``cloud``), their process marker and
sweep (``procs``), a simulated spot market (``market``) and per-node metadata endpoints serving each
cloud's notice paths on loopback (``metadata``). The embedded default and the tests' cloud. Imports the
shared provisioner, its boot package and the runtime's node daemons."""
