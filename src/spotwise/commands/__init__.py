"""CLI commands, one module each; a module exposes ``register(app)``. Discovered by ``spotwise.cli``."""
