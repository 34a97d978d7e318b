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
