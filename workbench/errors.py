"""Error types of the workbench, each mapped to the CLI exit code of STYLE.md.

Every error carries a one-line message (what went wrong) and an optional hint (what to do), so the CLI
can print ``workbench: error: <what>: <hint>`` and exit with the right code without a traceback.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_DATA = 65
EXIT_NO_INPUT = 66
EXIT_CONFIG = 78
EXIT_INTERRUPTED = 130


class WorkbenchError(Exception):
    """Base class: a user-facing failure with an exit code."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = " ".join(self.message.split())
        return f"{text}: {self.hint}" if self.hint else text


class UsageError(WorkbenchError):
    """Bad command-line usage (exit 2)."""

    exit_code = EXIT_USAGE


class DataError(WorkbenchError):
    """Input data that cannot be used as it is (exit 65)."""

    exit_code = EXIT_DATA


class MissingInputError(WorkbenchError):
    """An input file or directory that does not exist (exit 66)."""

    exit_code = EXIT_NO_INPUT


class ConfigError(WorkbenchError):
    """A configuration value or file that is wrong (exit 78)."""

    exit_code = EXIT_CONFIG
