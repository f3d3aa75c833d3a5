"""``Context``: what ``train(ctx)`` sees of the job, and how its state is registered and committed.

``train(ctx)`` is re-entered after every fault. User code rebuilds its model and optimizer
on each entry; ``ctx.register`` loads the recovered state into them, ``ctx.steps`` yields
from the step after the last commit, and ``ctx.commit()`` makes a step's update atomic:
when its block exits, the step is committed and protected (a copy is kept in this process's
memory and, for sharded state, on buddy ranks). Registered state must change only inside
``commit()`` blocks; everything between commits is redone after a fault.
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from resilience.elastic import BatchPlan, ElasticSampler
from resilience.state import snapshot


_restored_modules: "weakref.WeakSet[Any]" = weakref.WeakSet()
"""Modules whose whole state ``ctx.register`` just loaded from a commit: identical on every
rank, so ``resilience.ddp`` need not broadcast them again."""


class _Runtime(Protocol):
    """What a Context needs from the process that hosts it (the in-process agent)."""

    def before_step(self, step: int) -> None: ...
    def before_commit(self) -> None: ...
    def after_commit(self, step: int, ctx: "Context") -> None: ...


class Context:
    """What ``train`` sees of the job: ranks, the recovered step, registration and commits."""

    def __init__(self, *, rank: int, world_size: int, local_rank: int, generation: int, step: int,
                 restored: dict[str, Any] | None = None, runtime: _Runtime | None = None, log_dir: str = "",
                 batch_settings: tuple[str, str] | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.generation = generation
        self.step = step
        """Index of the last committed step; -1 before the first commit."""
        self._restored = restored or {}
        self._runtime = runtime
        self._objects: dict[str, Any] = {}
        self._current: int | None = None
        self.log_dir = log_dir
        """The run's log dir (empty outside ``sres run``): committed steps' samples are recorded there."""
        self._sampler: ElasticSampler | None = None
        self._batch_settings = batch_settings
        """The run's (batch policy, LR scaling), for a sampler not given its own."""

    def register(self, **objects: Any) -> None:
        """Protect these objects' state (``state_dict``/``load_state_dict``, or plain dicts).

        On re-entry after a fault, the recovered state is loaded into them here. FSDP2 modules
        and their optimizers are kept as their local shards (:mod:`resilience.fsdp`).
        """
        for name, obj in sorted(objects.items(), key=lambda item: not _is_module(item[1])):  # models first
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")) and not isinstance(obj, dict):
                raise TypeError(f"register({name}=...): needs state_dict/load_state_dict or a dict, got {type(obj).__name__}")
            if _is_module(obj) or _is_optimizer(obj):
                from resilience import fsdp

                obj = fsdp.adapt(name, obj, self._objects.values())
            self._objects[name] = obj
            if isinstance(obj, ElasticSampler):
                self._sampler = obj
                if self._batch_settings is not None:
                    obj.use_run_defaults(*self._batch_settings)
            if name in self._restored:
                _load(obj, self._restored.pop(name))
                if _is_module(obj):
                    _restored_modules.add(obj)

    def steps(self, total: int) -> Iterator[int]:
        """Step indices from the one after the last commit up to ``total - 1``."""
        for step in range(self.step + 1, total):
            if self._runtime is not None:
                self._runtime.before_step(step)
            self._current = step
            yield step

    @contextlib.contextmanager
    def commit(self) -> Iterator[None]:
        """The optimizer update of the current step; committed when the block exits cleanly."""
        if self._current is None:
            raise RuntimeError("ctx.commit() outside ctx.steps(): there is no step to commit")
        if self._runtime is not None:
            self._runtime.before_commit()
        yield
        step = self._current
        if self._runtime is not None:
            self._runtime.after_commit(step, self)
        self.step = step
        if self._sampler is not None and self.log_dir:
            self._sampler.record(self.log_dir, step, self.rank, self.world_size, self.generation)

    @property
    def batch(self) -> BatchPlan | None:
        """The registered ElasticSampler's :class:`~resilience.elastic.BatchPlan` at this world
        size (global batch used, micro-batches, LR scale), or None without a sampler."""
        return self._sampler.plan(self.world_size) if self._sampler is not None else None

    @property
    def accumulation(self) -> int:
        """Micro-batches per rank and step (gradient accumulation); 1 without a sampler."""
        return self.batch.accumulation if self._sampler is not None else 1

    @property
    def lr_scale(self) -> float:
        """Multiply the learning rate by this (the global batch could not be kept); 1 without a sampler."""
        return self.batch.lr_scale if self._sampler is not None else 1.0

    @property
    def has_sharded(self) -> bool:
        """Whether any registered object holds sharded state (needs per-commit buddy copies)."""
        return any(getattr(obj, "sharded", False) for obj in self._objects.values())

    def twins(self) -> tuple[int, ...]:
        """Ranks that hold this rank's whole sharded state too (HSDP: the same shards in the other
        replica groups); () when some of it exists only here."""
        sharded = [obj for obj in self._objects.values() if getattr(obj, "sharded", False)]
        found = {tuple(obj.twins()) if hasattr(obj, "twins") else () for obj in sharded}
        return found.pop() if len(found) == 1 else ()

    def states(self) -> dict[str, dict[str, Any]]:
        """name -> state of every registered object, split by kind: ``replicated`` / ``sharded``."""
        out: dict[str, dict[str, Any]] = {"replicated": {}, "sharded": {}}
        for name, obj in self._objects.items():
            kind = "sharded" if getattr(obj, "sharded", False) else "replicated"
            out[kind][name] = obj.state_dict() if hasattr(obj, "state_dict") else obj
        return out

    def state_digest(self) -> str:
        """SHA-256 of this rank's registered state: compare runs bitwise."""
        states = self.states()
        h = hashlib.sha256()
        for kind in ("replicated", "sharded"):
            h.update(snapshot.capture(states[kind], self.step).digest().encode())
        return h.hexdigest()


def _load(obj: Any, state: Any) -> None:
    if hasattr(obj, "load_state_dict"):
        obj.load_state_dict(state)
    else:
        obj.clear()
        obj.update(state)


def _is_module(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def _is_optimizer(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.optim.Optimizer)
