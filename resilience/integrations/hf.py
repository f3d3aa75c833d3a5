"""Hugging Face ``Trainer`` that recovers in process, from peers' memory, bitwise.

    def train(ctx):
        trainer = ResilientTrainer(ctx, model=model, args=TrainingArguments(...), train_dataset=data)
        trainer.train()

    resilience.run(train)

The Trainer is used as it is, with its own ``TrainingArguments``, data path (its sampler, accelerate's
sharded loader) and checkpoints (still written to ``output_dir``: the persistent complement). What
sres adds: the model, optimizer, scheduler and the loop's ``TrainerState`` registered with ``ctx``;
each optimizer step committed between the Trainer's ``on_pre_optimizer_step`` and ``on_step_end``
callbacks; and, when ``train`` is re-entered after a fault, the Trainer resumes from the last commit
as it would from a checkpoint of that step (the batches its epoch trained are skipped with its own
``get_resumed_dataloader``), with nothing read from disk.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

try:
    from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as missing:  # the framework is the user's; sres does not depend on it
    raise ImportError(
        f"{__name__} needs transformers: pip install 'slurm-resilience[hf]' ({missing})"
    ) from missing

from resilience.context import Context
from resilience.errors import RegistrationError

_FROM_COMMIT = "<sres: the last commit>"
"""What the Trainer's epoch sees as its ``resume_from_checkpoint``: resumed, from no directory."""


class ResilientTrainer(Trainer):
    """A ``transformers.Trainer`` whose state is sres's commits (see the module)."""

    def __init__(self, ctx: Context, *args: Any, **kwargs: Any) -> None:
        if ctx.resizable:
            raise RegistrationError(
                "ResilientTrainer in a run that may change its world size (--min-nodes/--max-nodes): "
                "the Trainer places its data by world size, so after a resize no rank would resume "
                "where it was; keep the world fixed"
            )
        self._sres_ctx = ctx
        self._sres_state = _StateOfTrainer(self)
        commits = _CommitEachStep(ctx, self._sres_state)
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or ()), commits]
        super().__init__(*args, **kwargs)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        if resume_from_checkpoint:
            raise RegistrationError(
                "ResilientTrainer.train(resume_from_checkpoint=...): sres resumes from its last commit; "
                "to start from a checkpoint on disk, load its weights into the model before the Trainer"
            )
        return super().train(**kwargs)

    # The Trainer's own resume points, fed from the commit instead of a checkpoint directory.

    def _init_training_state(
        self, max_steps: int, num_update_steps_per_epoch: int, num_train_epochs: int, *args: Any
    ) -> tuple[int, int]:
        super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs, *args)
        self._sres_ctx.register(trainer_state=self._sres_state)  # loads the committed counters
        if self._sres_ctx.step < 0:
            return 0, 0
        done = self.state.global_step
        in_epoch = 0 if self.args.ignore_data_skip else done % num_update_steps_per_epoch
        return done // num_update_steps_per_epoch, in_epoch * self.args.gradient_accumulation_steps

    def _prepare_for_training(
        self, max_steps: int, train_dataloader: Any, resume_from_checkpoint: Any
    ) -> Any:
        prepared = super()._prepare_for_training(max_steps, train_dataloader, None)
        objects: dict[str, Any] = {"model": self.model, "optimizer": self.optimizer}
        if self.lr_scheduler is not None:
            objects["lr_scheduler"] = self.lr_scheduler
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            objects["grad_scaler"] = scaler
        self._sres_ctx.register(**objects)
        return prepared

    def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
        if self._sres_ctx.step >= 0:
            kwargs["resume_from_checkpoint"] = _FROM_COMMIT  # skips the epoch's trained batches
        super()._run_epoch(*args, **kwargs)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if checkpoint != _FROM_COMMIT:
            super()._load_rng_state(checkpoint)
        # From a commit: sres sets the random streams as the step begins (the batches are fetched).


_NOT_COMMITTED = ("stateful_callbacks", "is_local_process_zero", "is_world_process_zero")
"""Fields of ``TrainerState`` that are this process's own (its callbacks' objects, whether it is
rank 0): a replaced rank 1 given rank 0's copy believed it was the world's process zero."""


class _StateOfTrainer:
    """The Trainer's loop counters (``TrainerState``: global step, epoch, flos, log history) as of
    the last commit: taken when it closes, at ``on_step_end``, and held until the next one (logging
    and the next fetch change the live state before the next step begins)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._state: dict[str, Any] = {}

    def capture(self) -> None:
        # As the Trainer writes it to a checkpoint's trainer_state.json: plain data.
        state = json.loads(json.dumps(dataclasses.asdict(self.trainer.state)))
        for own in _NOT_COMMITTED:
            state.pop(own, None)
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = dict(state)
        for name, value in state.items():
            setattr(self.trainer.state, name, value)


class _CommitEachStep(TrainerCallback):
    """Each optimizer step is a step of ``ctx``; its commit holds the update, the scheduler's step
    and the counters (the Trainer calls ``on_step_end`` after all three)."""

    def __init__(self, ctx: Context, state: _StateOfTrainer) -> None:
        self._ctx, self._state = ctx, state

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._ctx.begin_step(state.global_step)

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._ctx.open_commit()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._ctx.commit_open:
            self._state.capture()
            self._ctx.close_commit()
