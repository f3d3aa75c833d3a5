"""Integrations with the training frameworks people use instead of a raw loop.

Each module imports its framework (installed by the user, not a dependency of sres) and
drives :class:`resilience.Context` from the framework's own hooks: ``begin_step`` where the
framework starts a batch, ``open_commit``/``close_commit`` around its update, and the
framework's loop counters registered with the model and optimizers so that a re-entered
``train`` goes on at the step after the last commit.
"""
