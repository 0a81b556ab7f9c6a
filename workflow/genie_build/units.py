"""Units of size: the one definition of a MiB and a GiB (2**20 and 2**30 bytes) every module counts and prints in."""

from __future__ import annotations

__all__ = ["GIB", "MIB"]

MIB = 1024 ** 2
GIB = 1024 ** 3
