"""Batches for the ranks of a node: a node-local, memory-mapped cache keyed by global step and
sample indices (issue 33; :mod:`resilience.data.batch_file` is the file of one step's batch)."""
