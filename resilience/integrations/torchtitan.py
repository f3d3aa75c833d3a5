"""torchtitan: its ``Trainer`` recovering in process, from peers' memory, bitwise.

    def train(ctx):
        trainer = ResilientTrainer(ctx, config)     # config: torchtitan's Trainer.Config
        try:
            trainer.train()
        finally:
            trainer.close()

    resilience.run(train)

The subclass sits where torchft's does (torchtitan's ``experiments/torchft``): the process group
is sres's (formed before ``train``; torchtitan sees it initialized and builds its meshes on it),
and the Trainer is built anew in each entry of ``train``, on that generation's group. What sres
adds: the model (FSDP2/HSDP shards, :mod:`resilience.fsdp`), the optimizer, the LR scheduler,
this rank's data loader position and the Trainer's counters (``step``, ``ntokens_seen``)
registered with ``ctx``; each step's commit opened by the optimizer's step (after the gradient
clipping, before the update) and closed when ``train_step`` returns, after the scheduler moved.
Re-entered after a fault, the Trainer goes on at the step after the last commit, its loader at
the batch after it; torchtitan's own checkpoints (``checkpoint.enable``) are still written at
their interval, the persistent complement: a run that sres starts afresh (nothing in peers' memory
or in its tiers: a requeue without ``--persistent-dir``) resumes from the newest as torchtitan
would, and its commits go on from there (``ctx.start_after``).

Refused in one line: a run that may resize (the loader's position and the meshes are per world
size), pipeline parallelism (several model parts: not covered yet).
"""

from __future__ import annotations

from typing import Any

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchtitan.trainer import Trainer
except ImportError as missing:  # the framework is the user's; sres does not depend on it
    raise ImportError(
        f"{__name__} needs torchtitan: pip install 'slurm-resilience[torchtitan]' ({missing})"
    ) from missing

from resilience import fsdp
from resilience.context import Context
from resilience.errors import RegistrationError


class ResilientTrainer(Trainer):
    """torchtitan's ``Trainer`` whose state is sres's commits (see the module)."""

    def __init__(self, ctx: Context, config: Trainer.Config) -> None:
        if ctx.resizable:
            raise RegistrationError(
                "torchtitan's ResilientTrainer in a run that may change its world size "
                "(--min-nodes/--max-nodes): its meshes and its loader's positions are per world size; "
                "keep the world fixed"
            )
        if config.parallelism.pipeline_parallel_degree > 1:
            raise RegistrationError(
                "torchtitan's ResilientTrainer with pipeline parallelism "
                f"(parallelism.pipeline_parallel_degree={config.parallelism.pipeline_parallel_degree}): "
                "several model parts are not covered yet; use data parallelism (replicate or FSDP)"
            )
        self._sres_ctx, self._sres_training = ctx, False
        super().__init__(config)
        self._sres_counters = _Counters(self)
        optimizers = self.optimizers.optimizers
        schedulers = self.lr_schedulers.schedulers
        ctx.register(
            model=_ModelShards(self.model_parts[0]),
            **{f"optimizer{i}" if i else "optimizer": opt for i, opt in enumerate(optimizers)},
            **{f"lr_scheduler{i}" if i else "lr_scheduler": s for i, s in enumerate(schedulers)},
            data_position=_LoaderPosition(self.dataloader),
            trainer_counters=self._sres_counters,
        )
        for optimizer in optimizers:
            optimizer.register_step_pre_hook(self._sres_open_commit)
        self.checkpointer.load = self._sres_load(self.checkpointer.load)  # type: ignore[method-assign]

    def _sres_load(self, own_load: Any) -> Any:
        """``CheckpointManager.load`` under sres: an entry resumed from a commit loads nothing (the
        live state is newer than torchtitan's checkpoint); one that restored nothing lets torchtitan
        resume from its own newest checkpoint, and the commits go on from that step."""

        def load(step: int = -1) -> bool:
            if self._sres_ctx.step >= 0:
                return False
            loaded = own_load(step)
            if self.step > 0:
                self._sres_counters.capture()
                self._sres_ctx.start_after(self.step - 1)
            return bool(loaded)

        return load

    def train_step(self, data_iterator: Any) -> None:
        ctx = self._sres_ctx
        ctx.begin_step(self.step - 1)  # torchtitan counts steps from 1, sres from 0
        self._sres_training = True
        try:
            super().train_step(data_iterator)
        finally:
            self._sres_training = False
        if ctx.commit_open:
            self._sres_counters.capture()
            ctx.close_commit()

    def _sres_open_commit(self, *_: Any) -> None:
        # Only the update of a step: DCP steps an optimizer on zero gradients to make its state
        # (loading a commit into a new rank's optimizer).
        if self._sres_training and not self._sres_ctx.commit_open:  # several optimizers: one commit
            self._sres_ctx.open_commit()


class _ModelShards(fsdp.ShardedModel):
    """The model's shards under the names torchtitan's checkpoints give them: its modules' own
    ``state_dict`` (a fused QKV weight saved as ``wq``/``wk``/``wv`` by state-dict hooks, which
    DCP's ``get_model_state_dict`` cannot follow back to an attribute), as its checkpointer takes
    them. The optimizer's state still comes from DCP (it walks parameters, not state-dict keys)."""

    def state_dict(self) -> dict[str, Any]:
        return fsdp.to_local(self.module.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(fsdp.on_mesh(state, fsdp.mesh_of(self.module)))


class _LoaderPosition:
    """This rank's position in torchtitan's loader, as the ``StatefulDataLoader`` under it says it:
    torchtitan's own ``state_dict`` pickles it for DCP, and sres never unpickles what it keeps."""

    per_rank = True
    data_position = True

    def __init__(self, loader: StatefulDataLoader) -> None:
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        return {"position": StatefulDataLoader.state_dict(self.loader)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        StatefulDataLoader.load_state_dict(self.loader, state["position"])


class _Counters:
    """The Trainer's ``step`` and ``ntokens_seen`` (tokens this rank trained: its own) as of the
    last commit: taken as it closes and held (the loop counts the next step before it begins)."""

    per_rank = True

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._state = dict(trainer.state_dict())

    def capture(self) -> None:
        self._state = dict(self.trainer.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = dict(state)
        self.trainer.load_state_dict(self._state)
