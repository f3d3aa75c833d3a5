"""What cluster admins install: SPANK plugin, prolog/epilog/health-check hooks (see ARCHITECTURE.md).

One flow per hook run: ``hooks`` reads Slurm's environment, ``runner`` runs the enabled checks
(``checks/``, each in a killable child, under per-check and total budgets), ``health_log`` writes
one JSON line per result, ``actions.decide`` (pure) picks drain, reboot, resume or nothing, and
``actions.perform`` does it through ``SlurmClient`` (reasons ``sres: <check>: <detail>``). No
module here imports torch, and of the launcher only ``launcher.slurm``, ``launcher.errors``,
``launcher.privileges`` and ``launcher.arg_parser`` (``tests/unit/test_layout.py``).
"""
