"""Starting a run: ``request`` (``RunRequest``, the run as data, and its JSON), ``supervise``
(``supervise(request)``: the API the CLI and ``ResilientExecutor`` call), ``configs`` (a request
made into the supervisor's configs), ``environment`` (the ``SRES_*`` table), ``signal_latch``
(the requeue signal held from the first moment, before torch), ``processes`` (a run's processes
on this machine). ``environment``, ``signal_latch`` and ``request`` import no more than the
standard library and torch-free launcher modules: the latch runs before anything heavy is imported.
"""
