"""``python -m convoy`` is ``convoy``."""

from convoy.cli.main import entry_point

entry_point()
