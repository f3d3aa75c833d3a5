"""Performs the policy's actions: processes through the placement, Slurm through it, events.

The executor owns the run's mutable books (:class:`~launcher.supervisor.perform.books.Books`) and
hands each action to its performer (the modules beside it: ``faults``, ``nodes``, ``resizing``,
``end``: one function per action). It is also the one place an observation's facts
enter the books (:meth:`Executor.note`); the policy's input is built from them by the pure
:func:`~launcher.supervisor.perform.books.run_state`. A performer returns an
:class:`~launcher.supervisor.perform.books.Outcome` when the run ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

from launcher.supervisor.policy import actions as act
from launcher.supervisor.perform import end, faults, nodes, resizing
from launcher.supervisor.perform.books import Books, Outcome, run_state
from launcher.supervisor.perform.hands import Hands
from launcher.supervisor.observe.observer import SlotState
from launcher.supervisor.policy.resize import node_slots
from launcher.supervisor.observe.view import Observation, RunState

PERFORMERS: dict[type, Callable[[Hands, Any], Outcome | None]] = {
    act.KillSlot: faults.kill_slot,
    act.KillNode: faults.kill_node,
    act.BreakLink: faults.break_link,
    act.DropSpare: faults.drop_spare,
    act.HoldForCulprit: faults.hold,
    act.OpenFault: faults.open_fault,
    act.Drain: faults.drain,
    act.Release: faults.release,
    act.NoteStraggler: faults.note_straggler,
    act.WaitForNode: faults.wait_for_node,
    act.Launch: nodes.launch,
    act.Publish: nodes.publish,
    act.UseIdleNode: nodes.use_idle_node,
    act.AcquireNode: nodes.acquire_node,
    act.RefillSpare: nodes.refill_spare,
    act.StartStandby: nodes.start_standby,
    act.Answer: resizing.answer,
    act.ReportStatus: resizing.report_status,
    act.BeginResize: resizing.begin_resize,
    act.AddNodes: resizing.add_nodes,
    act.Pause: resizing.pause,
    act.AbandonResize: resizing.abandon_resize,
    act.Resize: resizing.resize,
    act.Requeue: end.requeue,
    act.Finish: end.finish,
    act.Fail: end.fail,
}
"""Each action's performer: a new action is one line here and one function in a performer module."""


class Executor:
    def __init__(self, hands: Hands) -> None:
        self.hands = hands
        self.books: Books = hands.books
        self.out: TextIO = hands.out
        self._hosts: tuple[int, dict[int, str]] = (-1, {})
        """node -> host, as of the books' ``placed`` count (rebuilt when slots change, not per tick)."""

    def perform(self, action: act.Action) -> Outcome | None:
        return PERFORMERS[type(action)](self.hands, action)

    def note(self, obs: Observation) -> None:
        """Take an observation's facts into the books: processes that ended are dead (a standby
        among them is forgotten, then replaced); a standby newly warm is announced, once."""
        b, h = self.books, self.hands
        for slot in obs.exited:
            b.slots[slot].alive = False
        b.standby = {s for s in b.standby if b.slots[s].alive}
        for slot in sorted(b.standby):
            if slot in obs.warm and slot not in b.announced:
                b.announced.add(slot)
                state = b.slots[slot]
                node = state.info.node
                h.events.emit(
                    "standby-ready",
                    node=node,
                    host=h.names.host(node),
                    slot=slot,
                    seconds=_to_ready(state, obs.warm_at.get(slot), h.clocks.clock()),
                )

    def view(self, obs: Observation) -> RunState:
        """The policy's input (see :func:`~launcher.supervisor.perform.books.run_state`)."""
        placed = self.books.placed
        if self._hosts[0] != placed:  # a slot was placed or moved since: its node may be new
            nodes = {info.node for info in self.books.infos().values()}
            self._hosts = (placed, {node: self.hands.names.host(node) for node in nodes})
        return run_state(self.books, obs, self.hands.config, self._hosts[1], self.hands.job.requeueable)

    def spare_slots(self) -> set[str]:
        ppn = self.hands.config.procs_per_node
        return {slot for node in self.books.spare_nodes for slot in node_slots(node, ppn)}

    def status(self) -> dict[str, object]:
        return resizing.status(self.hands)

    def fail(self, reason: str) -> Outcome:
        return end.fail(self.hands, act.Fail(reason))

    def after_stop(self) -> None:
        end.after_stop(self.hands)

    def say(self, text: str) -> None:
        self.hands.say(text)


def _to_ready(state: SlotState, ready_wall: float | None, now: float) -> float:
    """A process's start to warm by its own word; a look's time when it gave none."""
    if ready_wall is None or not state.started_wall:
        return now - state.started
    return max(0.0, ready_wall - state.started_wall)
