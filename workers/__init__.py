"""Celery workers for agent-runner."""
