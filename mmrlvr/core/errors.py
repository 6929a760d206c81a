"""Errors a training run stops with; the CLI prints their message (no traceback)."""


class TrainingError(RuntimeError):
    """A run that cannot go on (non-finite weights, only skipped steps); the message says why."""
