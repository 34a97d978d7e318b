"""What every workbench CLI shares: one-line usage errors (exit 2) and the mapping of exceptions to
STYLE.md's exit codes (``workbench: error: <what>: <hint>``; tracebacks only with ``--debug``)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import traceback

from .errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, WorkbenchError


def add_executor_args(p: argparse.ArgumentParser) -> None:
    """``--workers N`` / ``--scheduler ADDRESS``, the same on every CLI that runs independent jobs."""
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run the jobs in N spawned processes on this host, one per GPU (default 1: in process)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run the jobs on a Dask distributed cluster (e.g. tcp://host:8786), one GPU per job; "
                        "'local' starts one on this host (one worker per GPU, or --workers N)")


def add_data_args(p: argparse.ArgumentParser) -> None:
    """``--symbol``, the same on every CLI that reads bars."""
    p.add_argument("--symbol", metavar="ROOT|CONTRACT",
                   help="the product to run on when the file holds several (e.g. NQ, or one contract: NQU4); "
                        "names the product of a file without symbols (data.symbol)")


def data_overrides(args) -> list[str]:
    """``--set`` overrides from the data flags."""
    return [f'data.symbol="{args.symbol}"'] if getattr(args, "symbol", None) else []


def print_notes(notes, stream=None) -> None:
    """What was read and chosen, one line each on stderr: ``workbench: <level>: <line>``."""
    for level, line in notes:
        print(f"workbench: {level}: {line}", file=stream or sys.stderr, flush=True)


def executor_from_args(args, device: str):
    from .executor import make_executor

    return make_executor(args.workers, args.scheduler, device)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        print(f"workbench: error: {message}: see --help", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that ``finally`` blocks run (dashboard, lock, workers)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def run_guarded(run, args, interrupted: str) -> int:
    """Call ``run(args)``; turn failures into one stderr line and an exit code. SIGINT (Ctrl-C) and SIGTERM
    unwind the run (the dashboard stops and restores the terminal, finished work stays, the lock is
    released) and say how to resume: exit 130 and 143."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        return run(args)
    except WorkbenchError as exc:
        print(f"workbench: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        hint = getattr(args, "resume_hint", None)
        print(f"workbench: error: {what}: {interrupted}" + (f"; resume with: {hint}" if hint else ""), file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    except Exception as exc:  # an internal error: one line unless --debug
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"workbench: error: internal error: {type(exc).__name__}: {exc}: rerun with --debug for the traceback",
              file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
