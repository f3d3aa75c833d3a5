"""Reading the world into the frozen view the policy decides on, and nothing more.

The :class:`~launcher.supervisor.observe.observer.Observer` reads processes, the store and the
placement into one immutable :class:`~launcher.supervisor.observe.view.Observation` per tick;
``step_reports`` reads the ranks' step times; ``recovery_watch`` reads back how each recovery
went. What is read here changes nothing of the run: the policy can only be as pure as its input.
"""
