"""Task governance on Slurm: a team and priority-class policy turned into accounts, QOS and
slurm.conf lines (``sres governance apply``), and what the cluster did with it.

``policy`` reads and validates the file; ``slurm_objects`` (pure) says which accounting objects
the policy stands for; ``changes`` (pure) turns current objects into the desired ones as
``sacctmgr`` commands; ``apply`` runs them through the Slurm client, undoing them on a refusal.
"""
