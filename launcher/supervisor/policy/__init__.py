"""The supervisor's decisions, pure: a view in, a decision (actions and why) out.

A module here imports only the view, the actions, the configs, the contract's messages,
``launcher.errors`` and the other modules of this folder (``tests/unit/test_layout.py`` checks
the folder, so a new rule is held to it by where it is put, not by a list to keep).
"""
