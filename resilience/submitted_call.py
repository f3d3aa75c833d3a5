"""How a function submitted through ``ResilientExecutor`` is called: with the training context
where it asks for it, and as itself otherwise.

A function asks for the context with a parameter annotated ``resilience.Context`` (any
position, or keyword-only), or, as sres has always called them, with a first parameter named
``ctx`` and no annotation. Every other callable (``print``, a ``functools.partial``, a
``submitit.helpers.Checkpointable``) is called exactly as submitit would call it. Whether the
call can be made at all is decided at ``submit``, from the signature alone, so a mismatch is one
line in the submitting process, not a failed job minutes later. Nothing here imports torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

CONTEXT_SPELLINGS = frozenset({"Context", "resilience.Context", "resilience.context.Context"})
"""How a postponed annotation (``from __future__ import annotations``) may name it."""
LEGACY_NAME = "ctx"


def context_parameter(fn: Callable[..., Any]) -> inspect.Parameter | None:
    """The parameter that ``fn`` takes the training context by, if any."""
    params = _parameters(fn)
    for param in params:
        if _is_context(param.annotation):
            return param
    first = params[0] if params else None
    if (
        first is not None
        and first.name == LEGACY_NAME
        and first.annotation is inspect.Parameter.empty
        and first.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ):
        return first
    return None


def arguments(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], ctx: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``fn``'s arguments with ``ctx`` where ``fn`` asks for it (unchanged when it does not)."""
    param = context_parameter(fn)
    if param is None:
        return args, kwargs
    index = _parameters(fn).index(param)
    by_name = param.kind is inspect.Parameter.KEYWORD_ONLY or (
        param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and index >= len(args)
    )
    if by_name:
        return args, {**kwargs, param.name: ctx}
    return (*args[:index], ctx, *args[index:]), kwargs


def check(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise ValueError (one line) when ``fn`` cannot be called with these arguments."""
    if not callable(fn):
        raise ValueError(f"{fn!r} is not callable")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: only calling it can tell
    call_args, call_kwargs = arguments(fn, args, kwargs, ctx=object())
    try:
        signature.bind(*call_args, **call_kwargs)
    except TypeError as err:
        asks = context_parameter(fn)
        given = f"{len(args)} positional argument(s) and {sorted(kwargs) or 'no keywords'}"
        extra = f", plus the context as {asks.name!r}" if asks is not None else ""
        raise ValueError(f"cannot call {_name(fn)}{signature} with {given}{extra}: {err}") from None


def _parameters(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def _is_context(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return annotation.strip("'\"") in CONTEXT_SPELLINGS
    return (
        getattr(annotation, "__module__", None) == "resilience.context"
        and getattr(annotation, "__qualname__", None) == "Context"
    )


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__
