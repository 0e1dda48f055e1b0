"""A CSV of an IsoFLOP sweep without a flops column (issue 34, section 5): each point's compute is then 6·N·D,
which scatters by more than the 1% that groups points into one budget when N is a total parameter count; approach
2 gets no budget, and its note must say to add the column."""
from __future__ import annotations

from sweep_fixture import write_sweep
from transformer.scaling import fits
from transformer.scaling import points as points_lib


def test_a_csv_without_flops_is_told_to_add_the_column(tmp_path):
    rows = write_sweep(str(tmp_path / "sweep"))
    without = tmp_path / "without.csv"
    without.write_text("params,tokens,loss\n" + "".join(f"{r['params']},{r['tokens']},{r['eval_loss']}\n" for r in rows))
    fit = fits.fit_all(points_lib.read_csv(str(without)))
    assert fit["approach2"]["a"] is None
    assert "no flops column" in fit["approach2"]["note"] and "add a flops column" in fit["approach2"]["note"]
    with_flops = tmp_path / "with.csv"
    with_flops.write_text("params,tokens,flops,loss\n" + "".join(
        f"{r['params']},{r['tokens']},{r['budget']},{r['eval_loss']}\n" for r in rows))
    assert fits.fit_all(points_lib.read_csv(str(with_flops)))["approach2"]["a"] is not None  # the advice works
