"""Training state kept alive by peers: flat snapshots and who holds whose copy."""
