"""Result objects display themselves: HTML in a notebook, a rich table in a terminal, a report file."""
from __future__ import annotations

import pytest
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
    assert "fold 1 (momentum)" in fold and "test range" in fold
    console = Console(file=open(tmp_path / "t.txt", "w"), width=120)
    console.print(res)
    console.file.close()
    text = (tmp_path / "t.txt").read_text()
    assert "walk-forward: momentum" in text and "net_pnl_usd" in text and "252 trading days" in text
    out = res.to_html(tmp_path / "report.html")
    html = open(out).read()
    assert html.startswith("<!doctype html>") and "fold 1 (momentum)" in html and "<script" not in html


def test_plots_of_a_rule_result(tmp_path):
    res = WalkForward(load_config(None, ['strategy.name="momentum"', "splits.max_folds=2"])).run(str(SAMPLE))
    assert set(res.baseline_results) == {"buy-and-hold"}  # every other rule, on the same folds
    bh = res.baseline_results["buy-and-hold"]
    assert bh.equity_curve().index.equals(res.equity_curve().index)
    fig = res.plot(tmp_path / "wf.png")
    assert len(fig.axes) == 3  # equity, drawdown, per-fold Sharpe; no timing panel without training
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["momentum", "buy-and-hold"]
    assert (tmp_path / "wf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(res.fold_results[1].plot().axes) == 2
    assert res.epochs_frame().empty
    dsr = res.deflated_sharpe(10, sr_variance=0.01)
    assert 0.0 <= dsr <= res.deflated_sharpe(1, 0.01) <= 1.0  # more tries, a higher bar
    with pytest.raises(ValueError, match="n_trials"):
        res.deflated_sharpe(0, 0.01)
    assert len(res.daily_returns()) == res.metrics["days"]


def test_plots_and_epochs_of_a_resumed_agent_run(tmp_path):
    from workbench.rundir import RunDir

    cfg = load_config(None, ['device="cpu"', "splits.max_folds=1", "training.epochs=2",
                             "training.max_steps_per_epoch=3"])
    with RunDir(tmp_path / "run") as rd:  # locked while the run writes into it
        first = WalkForward(cfg).run(str(SAMPLE), run_dir=rd)
    with RunDir(tmp_path / "run", resume=True) as rd:
        again = WalkForward(cfg).run(str(SAMPLE), run_dir=rd)
    ep, ep2 = first.epochs_frame(), again.epochs_frame()  # EpochLog objects, then dicts read back from disk
    assert len(ep) == 2 and ep["chosen"].sum() == 1
    assert ep[["experience_ms", "training_ms", "validation_ms"]].equals(ep2[["experience_ms", "training_ms", "validation_ms"]])
    assert len(again.plot().axes) == 4 and len(again.fold_results[0].plot().axes) == 4  # + the Sharpe twin axis


def test_progress_argument():
    from workbench.dashboard import NotebookProgress, PlainProgress, resolve_progress

    assert resolve_progress("auto") is None  # outside a Jupyter kernel the API is silent
    assert resolve_progress(None) is None
    assert isinstance(resolve_progress("plain"), PlainProgress)
    assert isinstance(resolve_progress("notebook"), NotebookProgress)
    try:
        resolve_progress("loud")
    except ValueError as exc:
        assert "auto/live/plain/notebook/none" in str(exc)
    else:
        raise AssertionError("a bad progress mode was accepted")
