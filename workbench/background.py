"""Work started on a daemon thread while the caller goes on, its result (or error) taken later."""
from __future__ import annotations

import threading


def in_background(fn, name: str):
    """Start ``fn()`` on a daemon thread named ``name``; returns what waits for it and gives its result, or
    raises its error in the caller's thread. A daemon thread never holds up the process's exit (a run
    stopped early leaves it behind)."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the waiter
            box["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def wait():
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["result"]

    return wait


class Deferred:
    """``fn()``'s result, computed on a daemon thread named ``name`` once :meth:`start` is called (the first
    call starts it, later ones do nothing), or in the caller's thread by :meth:`result` if nothing started
    it: work whose moment to start is known only later (when the GPU is busy and the host only waits)."""

    def __init__(self, fn, name: str):
        self.fn, self.name, self._wait = fn, name, None

    def start(self) -> None:
        if self._wait is None:
            self._wait = in_background(self.fn, self.name)

    def result(self):
        return self._wait() if self._wait is not None else self.fn()
