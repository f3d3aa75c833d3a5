"""PyTorch Lightning: a ``Trainer`` that recovers in process, from peers, bitwise.

    def train(ctx):
        trainer = lightning.Trainer(..., num_nodes=ctx.place.num_nodes, devices=ctx.place.local_world_size,
                                    plugins=[ResilientEnvironment(ctx)], callbacks=[ResilientCallback(ctx)])
        trainer.fit(module, DataLoader(dataset, batch_size=..., shuffle=True))

    resilience.run(train)

``ResilientEnvironment`` tells Lightning this generation's ranks (sres formed the process group
already: Lightning must not start processes or form one). ``ResilientCallback`` registers the
module, the optimizers, the schedulers and Lightning's own loop counters, and drives the commit
from Lightning's hooks: a step begins at ``on_train_batch_start``, its commit opens at
``on_before_optimizer_step`` and closes at ``on_train_batch_end`` (where ``ModelCheckpoint``
saves, the point Lightning's own restart logic resumes from).

Lightning resumes a plain ``DataLoader`` at the start of its epoch (it has no position to
restore); the callback gives it one: the batches the epoch had trained when the commit was
taken are skipped in the sampler (indices only, no sample is loaded), so the first batch after
a recovery is the one the fault-free run trained next. A loader whose order cannot be brought
back so (a stateful loader Lightning wrapped in ``DistributedSamplerWrapper``, a custom batch
sampler, an iterable dataset) is refused in one line, never silently reshuffled.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Iterable, Iterator, Sized
from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import ClusterEnvironment
    from lightning.pytorch.callbacks import Callback
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
except ImportError as missing:  # the framework is the user's; sres does not depend on it
    raise ImportError(
        f"{__name__} needs lightning: pip install 'slurm-resilience[lightning]' ({missing})"
    ) from missing
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

from resilience.context import Context
from resilience.errors import RegistrationError
from resilience.integrations.epochs import EpochBatches


class ResilientEnvironment(ClusterEnvironment):
    """This generation's ranks as Lightning reads them; they change when ``train`` is re-entered
    (a replaced node, a resize), and the Trainer is built anew in each entry."""

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        self._ctx = ctx

    @property
    def creates_processes_externally(self) -> bool:
        return True  # sres started every rank: Lightning must not launch its own

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self._ctx.world_size

    def set_world_size(self, size: int) -> None:
        if size != self._ctx.world_size:
            place = self._ctx.place
            raise RegistrationError(
                f"the Trainer's num_nodes x devices is {size} ranks, this generation has "
                f"{self._ctx.world_size}: pass num_nodes=ctx.place.num_nodes ({place.num_nodes}) and "
                f"devices=ctx.place.local_world_size ({place.local_world_size})"
            )

    def global_rank(self) -> int:
        return self._ctx.rank

    def set_global_rank(self, rank: int) -> None:
        pass  # Lightning derives one from node and local rank; the generation's is the truth

    def local_rank(self) -> int:
        return self._ctx.local_rank

    def node_rank(self) -> int:
        return self._ctx.place.node


class ResilientCallback(Callback):
    """Registers what a Lightning fit holds and commits each optimizer step (see the module)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._loop: _LoopState | None = None
        self._begun: int | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not isinstance(trainer.strategy.cluster_environment, ResilientEnvironment):
            raise RegistrationError(
                "ResilientCallback needs the Trainer's ranks from sres: pass "
                "plugins=[ResilientEnvironment(ctx)] to lightning.Trainer"
            )
        # Before the strategy wraps the module (DDP broadcasts rank 0's parameters): the
        # committed state is loaded on every rank here, the same everywhere.
        self._ctx.register(model=pl_module)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._loop = _LoopState(trainer)
        objects: dict[str, Any] = {f"optimizer{i}": o for i, o in enumerate(trainer.optimizers)}
        for i, config in enumerate(trainer.lr_scheduler_configs):
            objects[f"scheduler{i}"] = config.scheduler
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            objects["grad_scaler"] = scaler
        self._ctx.register(**objects, lightning_loop=self._loop)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert self._loop is not None, "on_fit_start comes first"
        self._loop.resume_data()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._begun != trainer.global_step:  # the first micro-batch of an accumulated step
            self._ctx.begin_step(trainer.global_step)
            self._begun = trainer.global_step

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if not self._ctx.commit_open:  # several optimizers step in one commit
            self._ctx.open_commit()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._ctx.commit_open:
            assert self._loop is not None, "on_fit_start comes first"
            self._loop.capture()
            self._ctx.close_commit()


class _LoopState:
    """Lightning's fit-loop counters (epoch, batch and optimizer progress, which give
    ``global_step``) as of the last commit, and how many batches of its epoch were trained.

    Taken when the commit closes, at ``on_train_batch_end``, and held until the next: the next
    batch is fetched before the next step begins, and the loop's state then already counts it."""

    per_rank = True  # this rank's place in its epoch (committed.part_of: the rank part)
    data_position = True  # how many batches of the epoch this rank trained: per rank and world size

    def __init__(self, trainer: pl.Trainer) -> None:
        self.trainer = trainer
        self._state: dict[str, Any] = {}
        self._skip = 0

    def capture(self) -> None:
        loop = self.trainer.fit_loop
        progress = loop.epoch_loop.batch_progress
        self._state = {
            "fit_loop": copy.deepcopy(loop.state_dict()),
            # The batches of this epoch trained so far; none once its last batch is done.
            "batches_done": 0 if progress.is_last_batch else progress.current.processed,
        }

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = copy.deepcopy(state)
        self.trainer.fit_loop.load_state_dict(state["fit_loop"])
        self._skip = int(state["batches_done"])

    def resume_data(self) -> None:
        """Check that every training loader's order can be brought back, then skip in it the
        batches its epoch trained before the commit resumed from."""
        combined = self.trainer.fit_loop._combined_loader
        loaders = list(combined.flattened) if combined is not None else []
        for loader in loaders:
            _check_resumable(loader)
        if self._skip:
            for loader in loaders:
                _skip_batches(loader, self._skip)
            fetcher = self.trainer.fit_loop._data_fetcher
            if fetcher is not None:
                iter(fetcher)  # the iterator made before this (workers may have drawn indices) is replaced
            self._skip = 0


def resumable(loader: Any) -> "FabricBatches":
    """For ``lightning.Fabric``: the batches of a loader ``fabric.setup_dataloaders`` returned,
    epoch after epoch, with a position a commit holds (``ctx.register(loader=resumable(data))``).
    Fabric's own loader has none, and counts its passes as epochs (a pass made to resume one would
    be the next epoch's order)."""
    return FabricBatches(loader)


class FabricBatches(EpochBatches):
    """A Fabric loader's epochs (see :func:`resumable`); resumed inside one, the sampler Fabric
    injected skips the indices of the batches the epoch trained."""

    def __init__(self, loader: Any) -> None:
        _check_resumable(getattr(loader, "_dataloader", loader))
        super().__init__(loader)

    def epoch_batches(self, skip: int) -> Iterable[Any]:
        inner = getattr(self.loader, "_dataloader", self.loader)
        if skip:
            _skip_batches(inner, skip)
        if hasattr(self.loader, "_num_iter_calls"):
            self.loader._num_iter_calls = self.epoch  # Fabric sets the sampler's epoch from it
        elif hasattr(inner.batch_sampler.sampler, "set_epoch"):
            inner.batch_sampler.sampler.set_epoch(self.epoch)
        return self.loader


def _check_resumable(loader: Any) -> None:
    """One line for a loader whose position a commit cannot bring back exactly."""
    if not isinstance(loader, DataLoader):
        raise RegistrationError(
            f"a training loader of type {type(loader).__name__}: sres can resume a torch DataLoader "
            "(Lightning's default data path); give Trainer.fit a DataLoader"
        )
    if not isinstance(loader.batch_sampler, BatchSampler):
        raise RegistrationError(
            "a DataLoader with its own batch_sampler (or batch_size=None): sres cannot tell which "
            "batches an epoch trained before a fault; use batch_size= with a sampler"
        )
    sampler = loader.batch_sampler.sampler
    if isinstance(sampler, DistributedSamplerWrapper) or not isinstance(
        sampler, (DistributedSampler, SequentialSampler, _SkipFirst)
    ):
        inner = getattr(getattr(sampler, "dataset", None), "_sampler", sampler)  # what Lightning wrapped
        raise RegistrationError(
            f"the training {type(loader).__name__}'s sampler is a {type(inner).__name__}"
            f"{' (in a DistributedSamplerWrapper)' if inner is not sampler else ''}: its order after a "
            "recovery would not be the fault-free run's; give Lightning a torch DataLoader with "
            "shuffle=True (it injects a seeded DistributedSampler) or a DistributedSampler of your own"
        )


def _skip_batches(loader: DataLoader, batches: int) -> None:
    """The loader's next epoch starts ``batches`` batches in: its sampler skips their indices."""
    batch_sampler = loader.batch_sampler
    assert isinstance(batch_sampler, BatchSampler), "checked by _check_resumable"
    batch_sampler.sampler = _SkipFirst(batch_sampler.sampler, batches * batch_sampler.batch_size)


class _SkipFirst:
    """A sampler whose next pass skips its first ``count`` indices, then passes as it is."""

    def __init__(self, sampler: Any, count: int) -> None:
        self.sampler, self.count = sampler, count

    def __iter__(self) -> Iterator[int]:
        count, self.count = self.count, 0
        return itertools.islice(iter(self.sampler), count, None)

    def __len__(self) -> int:
        assert isinstance(self.sampler, Sized), "checked by _check_resumable"
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
