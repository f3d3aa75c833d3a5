"""How ``ResilientExecutor`` calls what it is given: the context where a function asks for it,
any other callable as itself, and a call that cannot bind refused at submit in one line."""

from __future__ import annotations

import functools

import pytest
from submitit.helpers import Checkpointable

import resilience
from launcher.submitit import ResilientExecutor
from resilience.submitted_call import arguments, check, context_parameter

CTX = object()


def add(a: int, b: int) -> int:
    return a + b


def legacy(ctx, steps: int) -> int:  # the form sres has always called: train(ctx, *args)
    return steps


def annotated_last(a: int, b: int, ctx: resilience.Context) -> int:
    return a + b


def keyword_only(a: int, *, ctx: "resilience.Context", scale: int = 1) -> int:
    return a * scale


def ctx_with_annotation(ctx: int) -> int:  # a user's own "ctx": annotated, so not ours
    return ctx


class Slacker(Checkpointable):
    def __call__(self, slack: bool = True) -> str:
        return "worked"


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "expected"),
    [
        (add, (1, 2), {}, ((1, 2), {})),
        (functools.partial(add, 1, 2), (), {}, ((), {})),
        (legacy, (20,), {}, ((CTX, 20), {})),
        (annotated_last, (1, 2), {}, ((1, 2), {"ctx": CTX})),
        (annotated_last, (1,), {"b": 2}, ((1,), {"b": 2, "ctx": CTX})),
        (keyword_only, (3,), {"scale": 2}, ((3,), {"scale": 2, "ctx": CTX})),
        (ctx_with_annotation, (5,), {}, ((5,), {})),
        (Slacker(), (), {"slack": False}, ((), {"slack": False})),
        (print, ("a", "b"), {}, (("a", "b"), {})),
    ],
    ids=[
        "plain",
        "partial",
        "legacy-ctx",
        "annotated-last",
        "annotated-by-name",
        "keyword-only",
        "users-own-ctx",
        "checkpointable",
        "builtin",
    ],
)
def test_the_context_goes_where_the_function_asks_for_it_and_nowhere_else(fn, args, kwargs, expected):
    assert arguments(fn, args, kwargs, CTX) == expected
    check(fn, args, kwargs)  # each of these can be called


def test_a_postponed_annotation_is_recognised_by_name():
    namespace: dict = {}
    exec("from __future__ import annotations\ndef f(x, c: resilience.Context): pass", namespace)
    assert context_parameter(namespace["f"]).name == "c"


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "says"),
    [
        (add, (1, 2, 3), {}, "with 3 positional argument(s) and no keywords: too many positional arguments"),
        (add, (1,), {"c": 2}, "and ['c']: missing a required argument: 'b'"),
        (legacy, (), {}, "plus the context as 'ctx': missing a required argument: 'steps'"),
        (42, (), {}, "42 is not callable"),
    ],
)
def test_a_call_that_cannot_bind_is_one_line(fn, args, kwargs, says):
    with pytest.raises(ValueError) as err:
        check(fn, args, kwargs)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_submit_refuses_before_anything_is_written(tmp_path):
    ex = ResilientExecutor(folder=tmp_path / "%j", cluster="local")
    with pytest.raises(ValueError, match="cannot call add"):
        ex.submit(add, 1, 2, 3)
    with pytest.raises(ValueError, match="cannot call add"):
        ex.map_array(add, [1, 2], [3, 4], [5, 6])
    assert not list(tmp_path.iterdir())  # no job folder, no pickle, no process
