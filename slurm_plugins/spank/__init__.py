"""The ``srun --auto-resume`` SPANK plugin: its C source (``sres_auto_resume.c``) and ``build``.

A package so that ``sres hooks build-spank`` and ``sres hooks install`` import ``build``, and so
that the C source ships in the wheel beside it, compiled on the cluster against its own ``spank.h``.
"""
