"""Test machinery shared by the tiers (pytest plugins), not tests."""
