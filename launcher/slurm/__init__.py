"""Everything that talks to Slurm, and nothing that needs torch: admin hooks may import only this.

``client`` (SlurmClient: every scontrol/sinfo/squeue/srun/sbatch call goes through it),
``command_driver`` and ``pyslurm_driver`` (the two ways it reaches Slurm), ``types`` (Job, Node),
``hostlist`` (Slurm's compressed host lists), ``discovery`` (which nodes a job holds now),
``satellites`` and ``satellite_watch`` (one-node jobs lent to a run), ``srun_args`` (what
``srun --auto-resume`` was asked for), ``templates`` (the sbatch scripts ``sres template`` prints).
"""
