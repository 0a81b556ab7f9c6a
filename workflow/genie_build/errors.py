"""The one domain error: a problem with a named file (or config key) that the user can fix."""

from __future__ import annotations

import os

__all__ = ["GenieBuildError"]


class GenieBuildError(Exception):
    """A user-facing error. ``str()`` is one line: ``<where>: <problem>``.

    Args:
        where: the file (or config key, or tensor) the problem is about.
        problem: what is wrong, with the offending value and the limit where there is one.
    """

    def __init__(self, where: str | os.PathLike[str], problem: str) -> None:
        self.where = os.fspath(where)
        self.problem = " ".join(str(problem).split())  # always one line
        super().__init__(f"{self.where}: {self.problem}")
