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
EXIT_CANT_CREATE = 73  # sysexits EX_CANTCREAT: an output file or directory cannot be created
EXIT_IO = 74           # sysexits EX_IOERR: reading or writing failed (a full disk, a vanished file)
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


class CantCreateError(WorkbenchError):
    """An output path that cannot be created (exit 73): permissions, a file in the way, a name too long."""

    exit_code = EXIT_CANT_CREATE


class IOFailure(WorkbenchError):
    """Reading or writing failed part way (exit 74): a full disk, an I/O error."""

    exit_code = EXIT_IO


def os_error(exc: OSError, doing: str, path) -> WorkbenchError:
    """The one-line error for an OSError while ``doing`` (e.g. 'create', 'write', 'read') ``path``."""
    import errno

    why = exc.strerror or type(exc).__name__
    hints = {errno.EACCES: "check the permissions of the folder", errno.EPERM: "check the permissions of the folder",
             errno.EROFS: "the file system is read-only: choose another --out",
             errno.ENOSPC: "free some disk space, then --resume the run",
             errno.ENAMETOOLONG: "use a shorter name or path", errno.ENOTDIR: "a file is in the way of that path",
             errno.EEXIST: "a file is in the way of that path"}
    hint = hints.get(exc.errno, "")
    if doing == "read":
        return MissingInputError(f"cannot read {path}: {why}", hint or None)
    cls = IOFailure if exc.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT) or doing == "write" else CantCreateError
    return cls(f"cannot {doing} {path}: {why}", hint or None)


class ConfigError(WorkbenchError):
    """A configuration value or file that is wrong (exit 78)."""

    exit_code = EXIT_CONFIG
