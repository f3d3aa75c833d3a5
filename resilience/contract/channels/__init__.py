"""The run store's channels: one small typed class per conversation between the supervisor and
the ranks, each over the :class:`~resilience.contract.store_core.StoreCore` that alone encodes.
"""
