"""Starting a run: ``environment`` (the ``SRES_*`` table), ``signal_latch`` (the requeue signal held
from the first moment, before torch), ``processes`` (a run's processes on this machine).
The first two are standard library only: they run before anything heavy is imported.
"""
