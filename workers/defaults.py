"""Default values shared by the settings and the command line, importable without the runner or the store."""

from __future__ import annotations

DEFAULT_DATABASE_URL = "sqlite:///./agent_runner.db"
"""The embedded default: a SQLite file in the working directory, migrated on first use."""
