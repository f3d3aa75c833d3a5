"""What ``sres run``/``sres srun`` reads before the command line is parsed (standard library only)."""
