"""Errors that reach a user.

Every error a user can cause is a :class:`SpotwiseError`; the CLI prints its message (never a
traceback) and exits with its ``exit_code``. Input problems are :class:`InputError`s that name the
field, what was given and what is allowed, so a bad file or flag can be fixed in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass


class SpotwiseError(Exception):
    """A failure with a message meant for the user."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem with user input: where, what was given, what is allowed."""

    field: str
    given: object
    allowed: str

    def __str__(self) -> str:
        return f"{self.field}: got {self.given!r}; allowed: {self.allowed}"


class InputError(SpotwiseError):
    """Bad user input (a task file, a flag, an API payload). Exit code 2, like a usage error."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | Problem, *, source: str = "input") -> None:
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        self.source = source
        lines = [f"{source}: {len(self.problems)} problem(s)"] + [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))
