"""Where the shipped defaults live: ``config/`` in a checkout, ``workbench/_config`` in a wheel.

``WORKBENCH_CONFIG_DIR`` overrides both, for users who keep their own market and GPU profiles.
"""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def config_dir() -> Path:
    """Return the directory holding ``markets/``, ``gpu/`` and ``training/`` TOML files."""
    override = os.environ.get("WORKBENCH_CONFIG_DIR")
    if override:
        return Path(override)
    installed = _PACKAGE_DIR / "_config"
    if (installed / "markets").is_dir():
        return installed
    checkout = _PACKAGE_DIR.parent / "config"
    return checkout


def config_file(*parts: str) -> Path:
    """Path of one shipped TOML file, e.g. ``config_file("markets", "cme.toml")``."""
    return config_dir().joinpath(*parts)
