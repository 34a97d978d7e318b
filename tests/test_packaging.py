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
    assert {"workbench/_config/markets/cme.toml", "workbench/_config/markets/generic.toml",
            "workbench/_config/training/dqn.toml", "workbench/_config/training/dqn-hyperopt.toml",
            "workbench/agent/trainer.py", "workbench/hyperopt/search.py", "workbench/cli.py"} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # every subpackage travels: the agent and the search, not only the top-level modules
    code = ("import workbench.resources as r, workbench.markets as m; "
            "import workbench.agent.trainer, workbench.agent.cpu_trainer, workbench.hyperopt.search, cuda_kernels.c51; "
            "print(r.config_dir()); print(m.load_market('es').point_value)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    where, pv = out.stdout.split()
    assert where.startswith(str(site)) and float(pv) == 50.0
