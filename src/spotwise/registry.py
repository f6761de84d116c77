"""One way to find a thing by name: clouds, price fetchers, policies and CLI commands.

A :class:`Registry` maps a name to an entry (a class or a function). Entries register themselves with
the :meth:`Registry.register` decorator in their own module; the registry finds those modules by
importing every module of the packages it was given, and of their subpackages (a cloud is a
package of its own: ``spotwise.provisioner.clouds.aws``), on the first lookup. So adding a cloud, a
fetcher, a policy or a command is one new file, and no central list repeats the names.

Importing a module must therefore stay cheap and must not need an optional dependency: the cloud
SDKs (``spotwise[aws]``, ``[gcp]``, ``[azure]``) are imported inside the functions that use them
(:func:`spotwise.extras.require`).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name → entry, filled by the modules of ``packages`` when first asked.

    ``kind`` names what is registered (``"cloud"``, ``"policy"``...); it is the field an unknown
    name is reported against, with the allowed names.
    """

    def __init__(self, kind: str, packages: tuple[str, ...], *, field: str | None = None) -> None:
        self.kind = kind
        self.field = field or kind
        self._packages = packages
        self._entries: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: make the decorated entry available as ``get(name)``; names are unique."""

        def deco(entry: T) -> T:
            have = self._entries.get(name)
            if have is not None and have is not entry:
                raise ValueError(f"{self.kind} {name!r} registered twice ({have!r} and {entry!r})")
            self._entries[name] = entry
            return entry

        return deco

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        todo = list(self._packages)
        while todo:
            package = todo.pop(0)
            pkg = importlib.import_module(package)
            for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
                if not mod.name.startswith("_"):
                    importlib.import_module(f"{package}.{mod.name}")
                    if mod.ispkg:
                        todo.append(f"{package}.{mod.name}")

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load()
        return sorted(self._entries)

    def get(self, name: str) -> T:
        """The entry called ``name``; an unknown name is an :class:`~spotwise.errors.InputError` that
        names the field and the allowed values."""
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            from spotwise.errors import InputError, Problem

            raise InputError(Problem(self.field, name, ", ".join(self.names()))) from None

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
