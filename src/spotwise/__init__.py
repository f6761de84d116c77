"""spotwise: train models on cloud GPUs for the least money.

Importing the top-level package is deliberately cheap (no torch, Ray, pandas or cloud SDKs):
the CLI's fast paths (``spotwise prices``) and the cold-start benchmark depend on it.
"""

__version__ = "0.1.0"
