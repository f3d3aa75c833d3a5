"""Reading a dataclass field's value as its annotated type, for frozen configs that arrive as text
(environment variables) or JSON values (lists, numbers) and must hold their declared types.

Shared by ``RunOptions`` and ``RunRequest``; standard library only, as the signal latch imports
both before torch. A value that cannot be read is a ``ConfigError`` naming the option's flag.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError
    return int(value)


def _number(value: Any) -> float:
    """A finite number: nan compares false with every bound, so a nan timeout or factor would
    turn its check off without a word."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError
    number = float(value)
    if not math.isfinite(number):
        raise ValueError
    return number


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError
    return str(value)


def _switch(value: Any) -> bool:
    return value.lower() in ("1", "true", "yes") if isinstance(value, str) else bool(value)


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(_text(item) for item in ([value] if isinstance(value, str) else value))


_READERS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "int": (_count, "a whole number"),
    "float": (_number, "a number"),
    "str": (_text, "text"),
    "bool": (_switch, "true or false"),
    "Path": (Path, "a path"),
    "tuple[str, ...]": (_texts, "a list of text"),
}
"""A field's annotation -> how a value is read as that type, and what the type is called."""


def _read(annotation: str, value: Any) -> Any:
    base = annotation.removesuffix(" | None")
    if base != annotation and (value is None or (base == "int" and str(value).lower() == "none")):
        return None  # 'none': no cap, as --max-requeues none
    return _READERS[base][0](value)


def read_fields(obj: object, name_of: Callable[[str], str]) -> None:
    """Each field of ``obj`` read as its annotation's type, in place (frozen: before anyone sees it)."""
    for f in fields(obj):  # type: ignore[arg-type]
        if f.type.removesuffix(" | None") not in _READERS:
            continue
        value = getattr(obj, f.name)
        try:
            object.__setattr__(obj, f.name, _read(str(f.type), value))
        except (TypeError, ValueError):
            what = _READERS[f.type.removesuffix(" | None")][1]
            raise ConfigError(f"{name_of(f.name)}: {value!r} is not {what}") from None
