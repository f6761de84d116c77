"""GPU offers: the shipped snapshot, live fetchers, integrity checks and the estimator.

Usable with no cloud credentials. Heavy imports (pandas) happen only in the functions that need
them, so ``spotwise prices`` stays fast from a cold process.
"""

from spotwise.pricing.offer import Market, Offer

__all__ = ["Market", "Offer", "load_catalog"]


def load_catalog(*args, **kwargs):
    """The full catalog as a pandas DataFrame (one row per offer); see :mod:`spotwise.pricing.catalog`."""
    from spotwise.pricing.catalog import load_catalog as _load

    return _load(*args, **kwargs)
