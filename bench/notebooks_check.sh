#!/usr/bin/env bash
# On a GPU machine: the notebook tests (small settings, DEVICE="gpu"), then both notebooks top to bottom
# with their own default settings on the GPU; the executed notebooks, the report and every figure
# (extracted to PNG for looking at) go to $OUT (default ./nb_out).
# Expects PYTHONPATH to hold the wheels (see bench/gpu_check.sh) and exports what Jupyter needs writable.
set -uo pipefail
OUT=${OUT:-nb_out}
mkdir -p "$OUT/png"
OUT=$(cd "$OUT" && pwd)
export JUPYTER_RUNTIME_DIR=/tmp/jupyter-runtime IPYTHONDIR=/tmp/ipython MPLCONFIGDIR=/tmp/mpl
rc=0
python3 -m pytest -q -p no:cacheprovider tests/test_notebooks.py tests/test_results_display.py || rc=1
python3 notebooks/run_notebooks.py --set 'DEVICE="gpu"' --set "REPORT=\"$OUT/quickstart_report.html\"" \
  --out "$OUT" notebooks/quickstart.ipynb || rc=1
python3 notebooks/run_notebooks.py --set 'DEVICE="gpu"' --out "$OUT" notebooks/walkforward_analysis.ipynb || rc=1
python3 - "$OUT" <<'PY' || rc=1
import base64, sys
from pathlib import Path
import nbformat
out = Path(sys.argv[1])
for p in sorted(out.glob("*.ipynb")):
    nb = nbformat.read(p, as_version=4)
    n = 0
    for i, c in enumerate(nb.cells):
        for o in c.get("outputs", []):
            if o.output_type == "stream" and o.name == "stdout":
                print(f"--- {p.name} cell {i} stdout\n{o.text}", end="")
            if "image/png" in o.get("data", {}):
                n += 1
                (out / "png" / f"{p.stem}_{n}.png").write_bytes(base64.b64decode(o.data["image/png"]))
    print(f"{p.name}: {n} figures extracted")
PY
exit $rc
