"""Small helpers written once and shared across spotwise (retry, timestamps, ports, processes).

Each module has one job and no spotwise dependencies, so any layer (pricing, provisioner, engine,
service, runtime) can use it without import cycles.
"""
