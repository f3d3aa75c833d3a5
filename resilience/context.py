"""``Context``: what ``train(ctx)`` sees of the job, and how its state is registered and committed.

``train(ctx)`` is re-entered after every fault. User code rebuilds its model and optimizer
on each entry; ``ctx.register`` loads the recovered state into them, ``ctx.steps`` yields
from the step after the last commit, and ``ctx.commit()`` makes a step's update atomic:
when its block exits, the step is committed and protected. Everything after the commit is
redone after a fault, on every rank, from the state as of the commit
(:mod:`resilience.state.committed`): registered objects, data loaders' positions and the random
streams, so that a loop that draws random numbers or advances an iterator between commits is
redone exactly. What the loop changes after the commit block and before its next step belongs
to the step just committed: it is taken again at the step boundary (and a warning says that a
fault landing in between would miss it).
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from resilience.elastic import BatchPlan, ElasticSampler
from resilience.errors import CommitOrderError, RegistrationError
from resilience.rank_place import RankPlace
from resilience import scheduled_lr, skip_init
from resilience.state import adopt, committed, snapshot

if TYPE_CHECKING:
    from resilience.data.batch_link import BatchLink


_restored_modules: "weakref.WeakSet[Any]" = weakref.WeakSet()
"""Modules whose whole state ``ctx.register`` just loaded from a commit: identical on every
rank, so ``resilience.ddp`` need not broadcast them again."""


def dtensors_loaded() -> bool:
    """Whether this process imported DTensor (FSDP2 does): only then may a module or optimizer hold
    DTensors, and :mod:`resilience.fsdp` is worth its imports (DCP, DTensor's ops and dynamo: 1.1 s,
    which every rank would otherwise pay at start and every warm spare before it can serve)."""
    return "torch.distributed.tensor" in sys.modules


class _Runtime(Protocol):
    """What a Context needs from the process that hosts it (the in-process agent)."""

    def before_step(self, step: int) -> None: ...
    def before_commit(self) -> None: ...
    def after_commit(self, step: int, ctx: "Context") -> None: ...
    def committed(self, step: int, ctx: "Context", changed: list[str]) -> None: ...
    def on_requeue(self, hook: Callable[[str], None]) -> None: ...
    def batch_link(self) -> "BatchLink": ...


class Context:
    """What ``train`` sees of the job: ranks, the recovered step, registration and commits."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        local_rank: int,
        generation: int,
        step: int,
        restored: dict[str, Any] | None = None,
        runtime: _Runtime | None = None,
        log_dir: str = "",
        batch_settings: tuple[str, str] | None = None,
        restore_rng: bool = True,
        place: RankPlace | None = None,
        resizable: bool = False,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.place = place or RankPlace(rank, world_size, local_rank, world_size, node=0, num_nodes=1)
        """This rank's node and its node's ranks too, in this generation (changes on re-entry)."""
        self.generation = generation
        self.step = step
        """Index of the last committed step; -1 before the first commit."""
        self._restored = dict(restored or {})
        self._rng = restore_rng
        self._rng_pending = self._restored.pop(committed.RNG, None) if restore_rng else None
        """The random streams as of the commit resumed from: set before the first step."""
        self._runtime = runtime
        self._objects: dict[str, Any] = {}
        self._current: int | None = None
        self.log_dir = log_dir
        """The run's log dir (empty outside ``sres run``): committed steps' samples are recorded there."""
        self._sampler: ElasticSampler | None = None
        self._batch_settings = batch_settings
        """The run's (batch policy, LR scaling), for a sampler not given its own."""
        self._resizable = resizable
        """The run's world may change size (``--min-nodes``/``--max-nodes``, ``sres grow``)."""
        self._view: dict[str, dict[str, Any]] | None = None
        """Every part's state as of step ``_view_step``'s commit (:func:`committed.take`)."""
        self._view_step = -2
        self._small: dict[str, Any] = {}
        self._checked = -2
        self._open = False
        """A commit opened by :meth:`open_commit` and not closed yet."""
        self._unfilled: skip_init.Unfilled | None = None

    def on_requeue(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(cause)`` when sres is about to requeue the job (``cause``: ``time-limit``
        or ``preemption``), after the newest commit was persisted and before the job ends: for
        what a commit cannot hold. It runs on a thread of this process while ``train`` may still
        run; the job waits for it within the minute it gives persisting and hooks together. Each
        entry of ``train`` adds its hooks anew (those of an earlier entry are dropped). Outside
        ``sres run`` nothing requeues the job: it is never called."""
        if self._runtime is not None:
            self._runtime.on_requeue(hook)

    @contextlib.contextmanager
    def skip_init(self) -> Iterator[None]:
        """Build the model inside: when this entry restores a commit, ``torch.nn.init`` is
        skipped (``register`` overwrites every parameter); otherwise nothing changes. A parameter
        built inside and not restored is refused at the first step (:mod:`resilience.skip_init`)."""
        if not self._restored:
            yield
            return
        self._unfilled = self._unfilled or skip_init.Unfilled()
        with skip_init.skipped(self._unfilled):
            yield

    def register(self, **objects: Any) -> None:
        """Protect these objects' state (``state_dict``/``load_state_dict``, or plain dicts).

        On re-entry after a fault, the recovered state is loaded into them here. FSDP2 modules
        and their optimizers are kept as their local shards (:mod:`resilience.fsdp`).
        """
        for name, obj in sorted(objects.items(), key=lambda item: not _is_module(item[1])):  # models first
            _check_registrable(name, obj)
            if self._resizable and (_is_data_loader(obj) or getattr(obj, "data_position", False)):
                raise RegistrationError(
                    f"register({name}=...): a data loader's position is per rank and this run may "
                    f"change its world size (--min-nodes/--max-nodes): after a resize no rank would "
                    f"have a position to resume from; use resilience.ElasticSampler, which names "
                    f"batches by step, or keep the world fixed"
                )
            if (_is_module(obj) or _is_optimizer(obj)) and dtensors_loaded():
                from resilience import fsdp

                obj = fsdp.adapt(name, obj, self._objects.values())
            self._objects[name] = obj
            if self._resizable and _is_scheduler(obj):
                scheduled_lr.follow(obj, lambda: self.lr_scale)
            if callable(getattr(obj, "sres_bind", None)):  # a BatchCache: this entry's rank and node
                obj.sres_bind(self, self._runtime.batch_link() if self._runtime is not None else None)
            if isinstance(obj, ElasticSampler):
                self._sampler = obj
                if self._batch_settings is not None:
                    obj.use_run_defaults(*self._batch_settings)
            if name in self._restored:
                _load(obj, self._restored.pop(name))
                if _is_module(obj):
                    _restored_modules.add(obj)
                    if self._unfilled is not None:
                        self._unfilled.restored(obj)
            elif self.step >= 0 and committed.part_of(obj) == "rank":
                raise RegistrationError(
                    f"register({name}=...): no position of this rank's data loader as of step {self.step} "
                    f"(saved at another world size, or lost with its copies): a loader's position is per "
                    f"rank; for resizes use resilience.ElasticSampler, which names batches by step"
                )

    def steps(self, total: int) -> Iterator[int]:
        """Step indices from the one after the last commit up to ``total - 1``."""
        for step in range(self.step + 1, total):
            self._begin(step)
            yield step
        self.boundary()

    def begin_step(self, step: int) -> None:
        """``step`` starts: what :meth:`steps` does before each step it yields, for a loop that a
        framework drives (an integration calls it from the framework's batch-start hook). ``step``
        must follow the last commit: a framework whose own counters were not restored would
        otherwise train steps under numbers sres never committed."""
        if step != self.step + 1 and not self._open:
            raise CommitOrderError(
                f"step {step} began after the commit of step {self.step}: the loop must go on at step "
                f"{self.step + 1} (restore the framework's step counters from the commit)"
            )
        self._begin(step)

    def start_after(self, step: int) -> None:
        """The framework resumed from its own checkpoint of ``step`` in a run that sres starts
        afresh (no commit in peers' memory or in the tiers): the loop goes on at ``step + 1``, and
        the first commit is of that step. Only before the first step of an entry that restored
        nothing: a commit is always newer than a framework's checkpoint."""
        if self.step >= 0 or self._current is not None:
            raise CommitOrderError(
                f"start_after({step}) in an entry that resumed after step {self.step} or began a step: "
                "only a run that starts afresh may go on from the framework's own checkpoint"
            )
        self.step = step

    def _begin(self, step: int) -> None:
        if self._open:
            raise CommitOrderError(
                f"step {step} began with the commit of step {self._current} still open: close_commit() first"
            )
        self.boundary()
        if self._runtime is not None:
            self._runtime.before_step(step)
        self._current = step

    def boundary(self) -> None:
        """Step ``self.step`` is over. On entry: the random streams as of the commit resumed
        from, and the state as loaded is that commit's. Otherwise: what the loop changed after
        the commit block belongs to that step; it replaces what the commit took.

        ``steps()`` calls it between steps; the runtime once more when ``train`` returns (a
        loop that left ``steps()`` early never reached the last boundary)."""
        if self._open:
            raise CommitOrderError(f"the commit of step {self._current} was left open: close_commit() it")
        if self._rng_pending is not None:
            committed.set_rng_state(self._rng_pending)
            self._rng_pending = None
        if self._view_step != self.step:  # entry: nothing was committed in this generation yet
            if self._unfilled is not None:
                self._unfilled.check()
            self._take(self.step)
            self._checked = self.step
            return
        if self._checked == self.step:
            return
        self._checked = self.step
        before = self._small
        self._take(self.step)
        if self._runtime is not None:
            self._runtime.committed(self.step, self, committed.changed(before, self._small))

    def _take(self, step: int) -> None:
        self._view = committed.take(self._objects, self._rng)
        self._view_step = step
        self._small = committed.small(self._view, self._objects)

    @contextlib.contextmanager
    def commit(self) -> Iterator[None]:
        """The optimizer update of the current step; committed when the block exits cleanly."""
        self.open_commit()
        yield
        self.close_commit()

    def open_commit(self) -> None:
        """The start of :meth:`commit`'s block, for a framework whose update runs between two of
        its hooks (Lightning: ``on_before_optimizer_step`` and ``on_train_batch_end``); a commit
        left open when the next step begins or ``train`` returns is an error."""
        if self._current is None:
            raise CommitOrderError("a commit outside a step: call begin_step() (or use ctx.steps()) first")
        if self._open:
            raise CommitOrderError(f"the commit of step {self._current} is open already")
        if self._runtime is not None:
            self._runtime.before_commit()
        self._open = True

    def close_commit(self) -> None:
        """The end of :meth:`commit`'s block: the current step is committed."""
        if not self._open:
            raise CommitOrderError("close_commit() without open_commit()")
        self._open = False
        step = self._current
        assert step is not None, "open_commit() needs a step"
        self._take(step)
        self.step = step
        if self._runtime is not None:
            self._runtime.after_commit(step, self)
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
    def commit_open(self) -> bool:
        """A commit opened (:meth:`open_commit`) and not closed yet: what a framework's hooks ask
        before opening (several optimizers step in one commit) or closing one."""
        return self._open

    @property
    def resizable(self) -> bool:
        """Whether this run's world may change size (``--min-nodes``/``--max-nodes``, ``sres
        grow``): a data position per rank cannot survive it."""
        return self._resizable

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
        """name -> state of every registered object as of the last commit (or, before the
        first, as registered), by part: ``replicated`` / ``sharded`` / ``rank``."""
        if self._view is None or self._view_step != self.step:
            self._take(self.step)
        return self._view

    def matches_commit(self) -> bool:
        """Whether the live objects still hold what the last commit took: nothing kept by
        reference (parameters, moments, large tensors) was changed in place since. Only then may
        a survivor resume from them without a copy."""
        return self._view is not None and not committed.changed(
            self._small, committed.small(self._view, self._objects)
        )

    def state_digest(self) -> str:
        """xxHash3-128 of this rank's registered state now, random streams left out: compare runs
        bitwise. The ``finished`` event's ``state_digests`` are this, taken at the end of
        ``train``, so a run's own digests and its events' can be compared (they were SHA-256 and
        xxHash3 of different parts)."""
        return snapshot.fingerprint(committed.take(self._objects, rng=False))


def _is_scheduler(obj: Any) -> bool:
    import torch.optim.lr_scheduler

    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler)


def _is_data_loader(obj: Any) -> bool:
    import torch.utils.data

    return isinstance(obj, torch.utils.data.DataLoader)


def _check_registrable(name: str, obj: Any) -> None:
    if name == committed.RNG:
        raise RegistrationError(f"register({name}=...): that name is sres's own; choose another")
    if type(obj).__name__ == "_FabricDataLoader":
        raise RegistrationError(
            f"register({name}=...): a loader Fabric set up has no position to save: register "
            f"resilience.integrations.lightning.resumable({name}) instead"
        )
    if getattr(obj, "use_stateful_dataloader", None) is False:  # accelerate's prepared loader
        raise RegistrationError(
            f"register({name}=...): a loader accelerate prepared without use_stateful_dataloader has no "
            f"position to save (its state_dict fails at the first commit): register "
            f"resilience.integrations.accelerate.resumable({name}) instead"
        )
    if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict") or isinstance(obj, dict):
        return
    import torch

    if isinstance(obj, torch.utils.data.DataLoader):
        raise RegistrationError(
            f"register({name}=...): a plain DataLoader cannot say where it is, so a recovered rank would "
            f"start its epoch over: use torchdata.stateful_dataloader.StatefulDataLoader, or "
            f"resilience.ElasticSampler and take the batch of each step from it"
        )
    raise RegistrationError(
        f"register({name}=...): needs state_dict/load_state_dict or a dict, got {type(obj).__name__}"
    )


def _load(obj: Any, state: Any) -> None:
    if _is_module(obj):
        adopt.load_module(obj, state)
    elif hasattr(obj, "load_state_dict"):
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
