"""Config defaults travel inside the wheel, so an installed package finds them too."""
from __future__ import annotations

import subprocess
import sys
import zipfile

from conftest import ROOT


def test_wheel_contains_config_and_finds_it(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    (wheel,) = tmp_path.glob("workbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"workbench/_config/markets/es.toml", "workbench/_config/markets/generic.toml"} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import workbench.resources as r, workbench.markets as m; "
            "print(r.config_dir()); print(m.load_market('es').point_value)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    where, pv = out.stdout.split()
    assert where.startswith(str(site)) and float(pv) == 50.0
