"""submitit's own tests, ported to ``ResilientExecutor`` (local: real processes, no Slurm)."""
