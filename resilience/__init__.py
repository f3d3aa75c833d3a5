"""Inside each rank: keeping training state alive across faults (see ARCHITECTURE.md).

The training API (``resilience.run``, ``Context``) lands with the checkpointless-core work.
"""
