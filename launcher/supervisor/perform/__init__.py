"""Carrying out the policy's actions: the only part of the supervisor that changes the run.

The :class:`~launcher.supervisor.perform.executor.Executor` keeps the run's mutable books and
hands each action to its performer (``faults``, ``nodes``, ``resizing``, ``end``) with the
run's :class:`~launcher.supervisor.perform.hands.Hands`; ``flush`` persists the newest state on
demand and ``producers`` keeps each node's batch producer running.
"""
