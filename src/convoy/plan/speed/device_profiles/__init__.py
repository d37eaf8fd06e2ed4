"""Measured device profiles (JSON), read by ``convoy.plan.speed.profiles``."""
