"""Starting, watching and re-starting ranks; all interaction with Slurm (see ARCHITECTURE.md)."""
