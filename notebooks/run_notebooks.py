"""Execute the notebooks top to bottom, headless, with their parameters cell overridden.

    python notebooks/run_notebooks.py [NOTEBOOK ...] [--set NAME=VALUE ...] [--out DIR] [--timeout S]
    python notebooks/run_notebooks.py --strip NOTEBOOK ...     # clear outputs before committing

CI runs both notebooks through this module (tests/test_notebooks.py) with small settings on the CPU
backend; on a GPU machine the same command runs them on the device. The cell tagged ``parameters``
holds every setting a run may change; ``--set`` replaces those assignments (values are Python
literals), so an executed notebook says in its own text which settings produced its outputs. The
kernel is this interpreter (``sys.executable``), whatever kernelspecs are installed.
"""
from __future__ import annotations

import argparse
import ast
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = ("quickstart.ipynb", "walkforward_analysis.ipynb")


def parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"expected exactly one cell tagged 'parameters', found {len(cells)}")
    return cells[0]


def override(nb, values: dict) -> None:
    """Rewrite ``NAME = ...`` lines of the parameters cell; a name it does not assign is an error."""
    cell = parameters_cell(nb)
    lines, seen = cell.source.splitlines(), set()
    for i, line in enumerate(lines):
        name = line.split("=", 1)[0].strip()
        if "=" in line and name in values and not line.lstrip().startswith("#"):
            comment = line.split("#", 1)[1] if "#" in line.split("=", 1)[1] else ""
            lines[i] = f"{name} = {values[name]!r}" + (f"  #{comment}" if comment else "")
            seen.add(name)
    missing = set(values) - seen
    if missing:
        raise KeyError(f"the parameters cell assigns no {sorted(missing)}")
    cell.source = "\n".join(lines)


def _kernel_manager():
    from ipykernel.kernelspec import get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return KernelSpec(resource_dir=str(HERE), **get_kernel_dict())

    return KernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())


def execute(path: str | Path, values: dict | None = None, timeout: int = 1200, out: Path | None = None):
    """Run one notebook in its own folder; returns the executed notebook (raises on the first failing cell)."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    if values:
        override(nb, values)
    client = NotebookClient(nb, km=_kernel_manager(), timeout=timeout,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out / path.name)
    return nb


def strip(path: str | Path) -> None:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
        c.get("metadata", {}).pop("execution", None)
    nbformat.write(nb, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", help=f"default: {', '.join(NOTEBOOKS)}")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a parameter")
    p.add_argument("--out", type=Path, help="write the executed notebooks here")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    p.add_argument("--strip", action="store_true", help="clear the outputs in place instead of running")
    a = p.parse_args(argv)
    paths = [Path(n) for n in a.notebooks] or [HERE / n for n in NOTEBOOKS]
    if a.strip:
        for n in paths:
            strip(n)
        return 0
    values = {}
    for item in a.set:
        name, _, text = item.partition("=")
        try:
            values[name.strip()] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            p.error(f"--set {item}: the value must be a Python literal (quote strings)")
    for n in paths:
        t0 = time.perf_counter()
        execute(n, values, a.timeout, a.out)
        print(f"{n.name}: ran top to bottom in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
