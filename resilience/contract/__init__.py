"""What the supervisor and every rank agree on: the rank environment, store keys and plans, liveness."""
