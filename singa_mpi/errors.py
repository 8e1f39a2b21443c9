"""Exceptions that reach the user as one line, without a traceback."""
from __future__ import annotations


class SingaError(Exception):
    """Base class: the CLI prints ``str(err)`` and exits with ``exit_code``."""

    exit_code = 1


class ConfigError(SingaError):
    """A job configuration is malformed or inconsistent (exit code 2).

    The message is one line: ``FILE:LINE:COL: layer 'x' (#i, kType): field = value: expected ...``.
    """

    exit_code = 2


class DataError(SingaError):
    """A data store is missing, truncated or does not match the configured shape."""

    exit_code = 3
