"""Optional dependencies: each cloud's SDK is an extra (``spotwise[aws]``, ``[gcp]``, ``[azure]``,
``[all]``), imported only by the code that calls that cloud.

:func:`require` is the one place that imports one: a missing SDK is a :class:`MissingExtra` that
names the extra to install, instead of an ``ImportError`` traceback from deep inside a call.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from spotwise.errors import SpotwiseError


class MissingExtra(SpotwiseError):
    """An optional dependency is not installed. Exit code 3: the input was fine, the install is not."""

    exit_code = 3

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        self.module, self.extra = module, extra
        super().__init__(f"{purpose} needs the {module!r} package, which is not installed; "
                         f"install it with: pip install 'spotwise[{extra}]'")


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` (e.g. ``"boto3"``), or raise :class:`MissingExtra` naming ``extra``.

    ``purpose`` says what needed it (``"the AWS cloud"``), so the message reads as a sentence."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name and not (module == exc.name or module.startswith(exc.name + ".")):
            raise        # the module is there but one of ITS imports failed: a real bug, keep the trace
        raise MissingExtra(module, extra, purpose) from None
