"""Result objects display themselves: HTML in a notebook, a rich table in a terminal, a report file."""
from __future__ import annotations

from rich.console import Console

from workbench.config import load_config
from workbench.engine import WalkForward

from conftest import SAMPLE


def test_html_rich_and_report(tmp_path):
    res = WalkForward(load_config(None, ['strategy.name="momentum"', "splits.max_folds=2"])).run(str(SAMPLE))
    page = res._repr_html_()
    assert "stitched out-of-sample" in page and "sharpe" in page and "252 trading days" in page
    assert f"{res.metrics['net_pnl_usd']:.6g}" in page
    fold = res.fold_results[0]._repr_html_()
    assert "fold 0 (momentum)" in fold and "test range" in fold
    console = Console(file=open(tmp_path / "t.txt", "w"), width=120)
    console.print(res)
    console.file.close()
    text = (tmp_path / "t.txt").read_text()
    assert "walk-forward: momentum" in text and "net_pnl_usd" in text and "252 trading days" in text
    out = res.to_html(tmp_path / "report.html")
    html = open(out).read()
    assert html.startswith("<!doctype html>") and "fold 1 (momentum)" in html and "<script" not in html
