"""Run directory: the resolved config, folds, per-fold results and the stitched series.

Layout::

    RUN/config.toml            resolved config (reproduces the run with --config)
    RUN/data_report.json       validation report of the input
    RUN/folds.parquet|json     the folds table
    RUN/fold_001/              metrics.json, trades.parquet, bars.parquet; for the agent also
                               epochs.json (per-epoch phase timings, losses, validation) and
                               weights.npy (the selected epoch's flat parameters); with
                               training.seeds = K > 1 the fold is the seeds' ensemble: weights.npy
                               [K, n], epochs.json every seed's epochs, and seed_SS_metrics.json,
                               seed_SS_trades.parquet, seed_SS_bars.parquet each seed alone;
                               written atomically
    RUN/summary.json           stitched out-of-sample metrics, per-fold table, annualisation
    RUN/oos_equity.parquet     stitched out-of-sample per-bar series

Every file is written to a temporary name and renamed into place; a fold directory appears only
once all its files are complete, so an interrupted run leaves finished folds intact.

Ownership and locking:

- ``RUN/.workbench-run`` (JSON: kind, creation time, PID) marks a directory the workbench made.
  ``--force`` empties only a directory carrying it, never the working directory, one of its parents,
  the home directory or ``/``; a folder with other content and no marker is refused.
- ``RUN/.workbench-lock`` is held (``flock``) for the run's life and names the holder's PID: a second
  run into the same directory, or a ``--force`` onto a running one, is refused naming that PID. The
  kernel drops the lock when its process dies, so the lock of a killed run is stale and taken over.
  A run takes the lock before it writes the marker, so a directory holding a lock and no marker is
  asked its lock first: a run arriving in that moment is refused naming the other's PID, and one that
  finds only a dead run's lock there uses the directory as if empty.
- ``RUN/fingerprint.json``: the input's content hash and the folds, checked by ``--resume``.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import math
import os
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import CantCreateError, UsageError, os_error

MARKER = ".workbench-run"
LOCK = ".workbench-lock"


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if hasattr(obj, "item"):
        return _clean(obj.item())
    if isinstance(obj, pd.Timestamp):
        return obj.isoformat()
    return obj


def dumps(obj) -> str:
    return json.dumps(_clean(obj), indent=2, default=str)


def _protected(path: Path) -> str:
    """Why ``path`` must never be emptied ('' if it may be)."""
    p, cwd, home = path.resolve(), Path.cwd().resolve(), Path.home().resolve()
    if p == Path(p.anchor):
        return "it is the file system's root"
    if p == home:
        return "it is the home directory"
    if p == cwd or p in cwd.parents:
        return "it is the working directory or one of its parents"
    return ""


@contextmanager
def _writing(path):
    """OSErrors while writing ``path`` become the one-line error (a full disk: exit 74)."""
    try:
        yield
    except OSError as exc:
        raise os_error(exc, "write", path) from exc


def _read_lock(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, OSError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _holder(fd: int, wait_s: float = 2.0) -> dict:
    """The record of the process holding the lock on ``fd``. The holder writes it just after taking the
    lock, so a process refused in between finds the file empty or still naming a dead run: it reads
    again (for up to ``wait_s``) until the record names a live process, then gives what it has."""
    deadline = time.monotonic() + wait_s
    while True:
        rec = _read_lock(fd)
        pid = rec.get("pid")
        mine = rec.get("host") == socket.gethostname()  # a PID of another host cannot be checked here
        if (isinstance(pid, int) and (not mine or _alive(pid))) or time.monotonic() >= deadline:
            return rec
        time.sleep(0.02)


class RunDir:
    """A run (or search) directory that this process owns and locks for its life (``close()`` releases).

    ``kind``: 'walkforward' or 'hyperopt'; ``force``: empty a previous run directory first; ``resume``:
    continue one. ``took_over``: the PID of a killed run whose stale lock was taken over, else ``None``.
    """

    def __init__(self, path: str | Path, force: bool = False, resume: bool = False, kind: str = "walkforward"):
        self.path = Path(path)
        self.resume, self.kind = resume, kind
        self.took_over: int | None = None
        self._lock_fd: int | None = None
        try:
            self._open(force)
        except OSError as exc:
            self.close()
            raise os_error(exc, "create", self.path) from exc

    def _open(self, force: bool) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise CantCreateError(f"cannot use {p} as the run directory: it is a file", "choose another --out")
        owned = (p / MARKER).is_file()
        if self.resume:
            if not owned:
                raise UsageError(f"cannot resume {p}: it is not a workbench {self.kind} directory (no {MARKER})",
                                 "resume the directory a run wrote (made by this version)")
            self._lock()
            return
        if p.exists() and not owned and (p / LOCK).exists():
            # a run creating this directory takes its lock before it writes its marker: ask the lock
            self._lock()  # refused, naming that run's PID, while it holds it
            owned = (p / MARKER).is_file()
            if not owned and not {e.name for e in p.iterdir()} - {LOCK, f".{MARKER}.tmp"}:
                self._mark()  # that run died between the two: only its lock is here, as good as empty
                return
            os.close(self._lock_fd)  # not that case: let go (the lock file stays) and judge as below
            self._lock_fd = None
        if p.exists() and any(p.iterdir()):
            if not owned:
                raise UsageError(f"run directory {p} exists and holds files the workbench did not write",
                                 "choose another --out" + ("; --force empties only run directories" if force else ""))
            if not force:
                raise UsageError(f"run directory {p} exists and is not empty",
                                 "pass --force to overwrite it, --resume to continue it, or choose another --out")
            why = _protected(p)
            if why:
                raise UsageError(f"refusing to empty {p}: {why}", "choose another --out")
        p.mkdir(parents=True, exist_ok=True)
        self._lock()
        if force:  # ours (marker checked above) and now locked: empty it, the lock file aside
            for entry in p.iterdir():
                if entry.name == LOCK:
                    continue
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        self._mark()

    def _mark(self) -> None:
        self.write_json(MARKER, {"kind": self.kind, "created": dt.datetime.now(dt.timezone.utc).isoformat(),
                                 "pid": os.getpid(), "host": socket.gethostname()})

    def _lock(self) -> None:
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UsageError(f"run directory {self.path} is in use by PID {holder.get('pid', '?')} on "
                             f"{holder.get('host', '?')} (since {holder.get('since', '?')})",
                             "wait for that run to finish, or choose another --out") from None
        stale = _read_lock(fd)
        if stale.get("pid") and stale.get("pid") != os.getpid():
            self.took_over = int(stale["pid"])  # its process died: the kernel released its lock
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": dt.datetime.now().isoformat(timespec="seconds")}).encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        """Release the lock (the run is over, finished or not)."""
        if self._lock_fd is not None:
            try:
                os.unlink(self.path / LOCK)
            except OSError:
                pass
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def __del__(self) -> None:  # an object dropped without close() still frees its directory
        self.close()

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write_text(self, name: str, text: str) -> Path:
        dest = self.path / name
        tmp = dest.with_name(f".{dest.name}.tmp")
        with _writing(dest):
            tmp.write_text(text)
            os.replace(tmp, dest)
        return dest

    def write_json(self, name: str, obj) -> Path:
        return self.write_text(name, dumps(obj) + "\n")

    def write_parquet(self, name: str, df: pd.DataFrame, directory: Path | None = None) -> Path:
        dest = (directory or self.path) / name
        tmp = dest.with_name(f".{dest.name}.tmp")
        with _writing(dest):
            df.to_parquet(tmp)
            os.replace(tmp, dest)
        return dest

    def write_fold(self, fold: int, metrics: dict, trades: pd.DataFrame, bars: pd.DataFrame, extra: dict | None = None,
                   files: dict | None = None) -> Path:
        final = self.path / f"fold_{fold:03d}"
        tmp = self.path / f".fold_{fold:03d}.tmp"
        with _writing(final):
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            (tmp / "metrics.json").write_text(dumps({"fold": fold, **metrics, **(extra or {})}) + "\n")
            trades.to_parquet(tmp / "trades.parquet")
            bars.to_parquet(tmp / "bars.parquet")
            for name, obj in (files or {}).items():
                if name.endswith(".npy"):
                    np.save(tmp / name, obj)
                elif name.endswith(".parquet"):
                    obj.to_parquet(tmp / name)
                else:
                    (tmp / name).write_text(dumps(obj) + "\n")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        return final

    def finished_fold(self, k: int):
        """The k-th fold (from 0; its directory and number count from 1) as written by an earlier run
        (``None`` if absent or incomplete)."""
        from .results import FoldResult

        fold = k + 1
        d = self.path / f"fold_{fold:03d}"
        if not (d / "metrics.json").is_file():
            return None
        meta = json.loads((d / "metrics.json").read_text())
        ranges, strategy = meta.pop("ranges", {}), meta.pop("strategy", "")
        meta.pop("fold", None)
        agent = (d / "epochs.json").is_file()
        members = [FoldResult(fold, strategy, pd.read_parquet(d / f"seed_{s:02d}_bars.parquet"),
                              pd.read_parquet(d / f"seed_{s:02d}_trades.parquet"),
                              json.loads((d / f"seed_{s:02d}_metrics.json").read_text()), ranges)
                   for s in range(int(meta.get("seeds", 0)))]  # a seed ensemble's fold says how many
        return FoldResult(fold, strategy, pd.read_parquet(d / "bars.parquet"), pd.read_parquet(d / "trades.parquet"),
                          meta, ranges, epochs=json.loads((d / "epochs.json").read_text())["epochs"] if agent else [],
                          params=np.load(d / "weights.npy") if agent else None, members=members)
