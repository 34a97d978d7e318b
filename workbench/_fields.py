"""Config field helper shared by every frozen config dataclass."""
from __future__ import annotations

from dataclasses import field
from typing import Any


def _f(default: Any, doc: str):
    """A dataclass field with a default and a one-line doc (``doc`` metadata)."""
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for sequence defaults")
    return field(default=default, metadata={"doc": doc})
