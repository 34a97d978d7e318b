"""Both notebooks run top to bottom (small settings; the CPU backend here, the GPU on a GPU machine),
and are committed with their outputs stripped."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest

from cuda_kernels.nb import gpu_available

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "notebooks" / "run_notebooks.py")
run_notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_notebooks)

SMALL = {"DEVICE": "gpu" if gpu_available() else "cpu", "EPOCHS": 2, "MAX_STEPS_PER_EPOCH": 10, "MAX_FOLDS": 2}


def _outputs(nb, kind: str) -> list[str]:
    """Every output of one MIME type (or stream text for 'stream')."""
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            if kind == "stream" and o.output_type == "stream":
                out.append(o.text)
            elif kind != "stream" and kind in o.get("data", {}):
                out.append(o.data[kind])
    return out


@pytest.mark.parametrize("name", run_notebooks.NOTEBOOKS)
def test_committed_without_outputs(name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code), \
        f"{name} has outputs: python notebooks/run_notebooks.py --strip notebooks/{name}"
    run_notebooks.parameters_cell(nb)  # exactly one cell tagged 'parameters'


def test_override_rewrites_only_named_parameters():
    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    run_notebooks.override(nb, {"EPOCHS": 3, "DEVICE": "cpu"})
    src = run_notebooks.parameters_cell(nb).source
    assert "EPOCHS = 3  #" in src and "DEVICE = 'cpu'  #" in src and 'DATA = "../data/es_sample.parquet"' in src
    with pytest.raises(KeyError, match="NOT_A_PARAMETER"):
        run_notebooks.override(nb, {"NOT_A_PARAMETER": 1})


@pytest.mark.slow
def test_quickstart_runs_top_to_bottom(tmp_path):
    report = tmp_path / "report.html"
    nb = run_notebooks.execute(ROOT / "notebooks" / "quickstart.ipynb", {**SMALL, "REPORT": str(report)},
                               timeout=900, out=tmp_path)
    html = "".join(_outputs(nb, "text/html"))
    assert "workbench walk-forward (finished)" in html and "folds 2/2" in html  # the in-place progress table
    assert "stitched out-of-sample against the baselines" in html
    assert len(_outputs(nb, "image/png")) == 2  # the walk-forward figure and one fold's
    text = "".join(_outputs(nb, "stream"))
    assert "errors: 0" in text and "60,000 bars kept" in text and "rolling folds, train 20,000 bars" in text
    page = report.read_text()
    assert page.count("<img ") == 1 + 2 and "data:image/png;base64," in page and "<script" not in page


@pytest.mark.slow
def test_analysis_runs_top_to_bottom(tmp_path):
    nb = run_notebooks.execute(ROOT / "notebooks" / "walkforward_analysis.ipynb", SMALL, timeout=900, out=tmp_path)
    text = "".join(_outputs(nb, "stream"))
    assert f"backend: {SMALL['DEVICE']}" in text
    assert "deflated Sharpe for 3 tries, per-day Sharpe variance" in text and "ms per update in the steady state" in text
    assert "95% interval" in text
    assert len(_outputs(nb, "image/png")) == 1
    html = "".join(_outputs(nb, "text/html"))
    assert "buy-and-hold" in html and "momentum" in html and "experience_ms" in html
