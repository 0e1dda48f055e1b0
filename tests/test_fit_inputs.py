"""Input as published sweeps have it (issue 31 §5): duplicated rows, units, identifier columns, other column names,
a single budget. Each is one clear error or a fit with a note, never a silent mistake or a traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from transformer.scaling import csv_checks, fits, noise, report
from transformer.scaling import points as points_lib
from transformer.spec import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHINCHILLA = os.path.join(REPO, "experiments", "reference_data", "chinchilla_hoffmann2022.csv")


def law(n, d):
    return 1.8 + 400 / n**0.34 + 2000 / d**0.37


def grid(budgets=(1e18, 4e18, 1.6e19, 6.4e19), sizes=7, jitter=0.0, seed=0):
    """An IsoFLOP grid of `law` with 0.3% noise: (N, D, C, loss), (P,) each; `jitter`: the measured FLOPs' spread."""
    rng = np.random.default_rng(seed)
    n, c = [], []
    for flops in budgets:
        n.extend(0.1 * flops**0.5 * np.geomspace(1 / 8, 8, sizes))
        c.extend([flops] * sizes)
    n, c = np.array(n), np.array(c) * (1 + jitter * rng.normal(size=len(n)))
    d = c / (6 * n)
    return n, d, c, law(n, d) * np.exp(rng.normal(0, 0.003, len(n)))


def write_csv(path, header, rows) -> str:
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)
    return str(path)


def fit_cli(*args):
    return subprocess.run([sys.executable, "-m", "experiments.fit", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_a_duplicated_row_is_merged_not_a_seed_replicate(tmp_path):
    """One row of Chinchilla's points listed twice: before, the pair was a seed replicate of zero spread, σ = 0 "from
    replicates" fell to "no noise estimate" and every interval changed; now the row is kept once, σ and the points
    are those of the file without it, and fit.json and the console say what was merged."""
    lines = open(CHINCHILLA).read().splitlines()
    path = tmp_path / "dup.csv"
    path.write_text("\n".join(lines + [lines[7]]) + "\n")
    clean, dup = points_lib.read_csv(CHINCHILLA), points_lib.read_csv(str(path))
    assert len(dup) == len(clean)
    assert noise.estimate(dup) == noise.estimate(clean)
    assert {"id": f"row{len(lines) + 1}", "reason": "duplicate of row8 (equal params, tokens, flops and loss): merged"} \
        in dup.excluded
    assert "1 duplicate row(s) merged (row247 = row8)" in dup.notes[0]
    fit = fits.fit_all(dup, approach3_near=0)
    assert fit["input_notes"] == list(dup.notes)
    assert "input: 1 duplicate row(s) merged" in report.summary(fit)


def test_a_sweep_run_listed_under_two_ids_is_merged(tmp_path):
    """Two runs of a sweep with equal params, tokens, flops and loss (one run recorded twice under two ids) count
    once, as in a CSV."""
    n, d, c, loss = grid(budgets=(1e18, 1e19), sizes=5)
    rows = [{"run_id": f"r{i}", "params": n[i], "tokens": d[i], "flops": c[i], "eval_loss": loss[i], "status": "ok"}
            for i in range(len(n))]
    rows.append({**rows[2], "run_id": "r2-again"})
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pts = points_lib.read_sweep(str(tmp_path))
    assert len(pts) == len(n) and "r2-again" not in pts.ids
    assert noise.estimate(pts)["kind"] == "residuals"


@pytest.mark.parametrize("column, change, message", [
    ("tokens", lambda r: {**r, "tokens": np.log10(r["tokens"])}, r"column 'tokens' = 10\.\d+ at row 2 .*plausible"),
    ("params", lambda r: {**r, "params": r["params"] / 1e6}, r"column 'params' = .* at row 2 .*not millions"),
    ("flops", lambda r: {**r, "flops": r["flops"] / 1e9}, r"column 'flops' is 1e-09 × 6·params·tokens at row 2"),
    ("loss", lambda r: {**r, "loss": np.exp(r["loss"])}, r"column 'loss' = .* above 20 nats"),
])
def test_units_off_their_scale_are_one_error_naming_the_column(tmp_path, column, change, message):
    """Tokens in log10, params in millions, GFLOPs, a perplexity: before, each was fitted (N_opt 2e5, α = 16)."""
    n, d, c, loss = grid()
    rows = [change({"params": a, "tokens": b, "flops": f, "loss": l}) for a, b, f, l in zip(n, d, c, loss)]
    path = write_csv(tmp_path / "units.csv", ["params", "tokens", "flops", "loss"],
                     [[r["params"], r["tokens"], r["flops"], r["loss"]] for r in rows])
    with pytest.raises(ConfigError, match=message):
        points_lib.read_csv(path)


def test_units_error_through_the_cli_is_one_line_and_writes_nothing(tmp_path):
    n, d, c, loss = grid()
    path = write_csv(tmp_path / "gflops.csv", ["params", "tokens", "flops", "loss"], zip(n, d, c / 1e9, loss))
    proc = fit_cli(f"--points={path}", f"--out={tmp_path / 'out'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "column 'flops'" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_column_unique_per_row_is_an_identifier_ignored_with_a_note(tmp_path):
    """A published sweep's `Name` column names each run: before, it was taken for a setting ("the rows kept mix 28
    settings"); a column that names a setting is still one."""
    n, d, c, loss = grid()
    names = [f"run-{i}" for i in range(len(n))]
    path = write_csv(tmp_path / "named.csv", ["Name", "params", "tokens", "flops", "loss"], zip(names, n, d, c, loss))
    pts = points_lib.read_csv(path)
    assert len(pts) == len(n)
    assert pts.notes == ("column 'Name' differs on every row: an identifier of the run, ignored",)
    mixed = write_csv(tmp_path / "mixed.csv", ["setting", "params", "tokens", "flops", "loss"],
                      [("a", *row) for row in zip(n, d, c, loss)] + [("b", *row) for row in zip(n, d, c, 1.1 * loss)])
    with pytest.raises(ConfigError, match="mix 2 settings"):
        points_lib.read_csv(mixed)


def test_a_csv_with_flops_may_leave_out_tokens_or_params(tmp_path):
    """Published sweeps give model size and compute (Chinchilla's figure extracted: `Model Size`, `Training FLOP`):
    before, 'column tokens is missing'. With flops, the absent one of params and tokens is C / (6·the other), said in
    a note; its scale is checked and the error then names the flops and the other column."""
    n, d, c, loss = grid(jitter=0.05)
    full = points_lib.read_csv(write_csv(tmp_path / "full.csv", ["params", "tokens", "flops", "loss"],
                                         zip(n, c / (6 * n), c, loss)))
    sizes = points_lib.read_csv(write_csv(tmp_path / "sizes.csv", ["Model Size", "Training FLOP", "loss"],
                                          zip(n, c, loss)), columns={"params": "Model Size", "flops": "Training FLOP"})
    np.testing.assert_allclose(sizes.tokens_P, full.tokens_P, rtol=1e-12)
    np.testing.assert_array_equal(sizes.flops_P, full.flops_P)
    assert sizes.notes == ("column 'tokens' absent: tokens = flops / (6·params) on every row (C = 6·N·D)",)
    tokens_only = points_lib.read_csv(write_csv(tmp_path / "tokens.csv", ["D", "flops", "loss"], zip(d, c, loss)))
    np.testing.assert_allclose(tokens_only.params_P, c / (6 * d), rtol=1e-12)
    assert fits.fit_all(sizes, approach3_near=0, bootstrap=0)["approach3"]["alpha"] == pytest.approx(
        fits.fit_all(full, approach3_near=0, bootstrap=0)["approach3"]["alpha"], rel=1e-6)
    with pytest.raises(ConfigError, match=r"column 'tokens' \(not in the file: flops / \(6·params\)\) = .* give flops "
                                          r"as FLOPs \(not GFLOPs"):
        points_lib.read_csv(write_csv(tmp_path / "gflops.csv", ["params", "flops", "loss"], zip(n, c / 1e9, loss)))
    with pytest.raises(ConfigError, match="column 'tokens' is missing"):  # without flops nothing gives it
        points_lib.read_csv(write_csv(tmp_path / "none.csv", ["params", "loss"], zip(n, loss)))


def test_a_text_column_with_most_values_on_one_or_two_rows_describes_points(tmp_path):
    """Chinchilla's extracted points carry each marker's colour (99 values over 245 rows, a model size under several):
    before, 'the rows kept mix 99 settings'. A column most of whose values hold fewer rows than a fit needs describes
    the points and is ignored with a note; a setting column (many rows per value) is still one."""
    n, d, c, loss = grid()
    rows = [*zip(n, d, c, loss), *zip(n, d, c, 1.003 * loss)]  # two seeds: each size on two rows
    colours = [f"#{i // 2:06x}" for i in range(len(rows))]  # pairs of rows share a colour, each size under two
    pts = points_lib.read_csv(write_csv(tmp_path / "colours.csv", ["color", "params", "tokens", "flops", "loss"],
                                        [(k, *row) for k, row in zip(colours, rows)]))
    assert len(pts) == len(rows)
    assert pts.notes == (f"column 'color' has {len(rows) // 2} values over {len(rows)} rows, most on fewer than 3: "
                         "it describes points, not a setting to pick; ignored",)
    three = [(f"s{k}", *row) for k in range(3) for row in zip(n, d, c, (1 + 0.1 * k) * loss)]  # each the whole grid
    with pytest.raises(ConfigError, match="mix 3 settings"):
        points_lib.read_csv(write_csv(tmp_path / "three.csv", ["setting", "params", "tokens", "flops", "loss"], three))


def test_columns_maps_other_names(tmp_path):
    """`--columns params=parameter_count,...` reads a header with other names (a column it replaces is ignored);
    a name that is not one of the four, or a column the file does not have, is one error."""
    n, d, c, loss = grid()
    path = write_csv(tmp_path / "other.csv", ["parameter_count", "params", "train_tokens", "compute", "val_loss"],
                     zip(n, n / 2, d, c, loss))
    columns = {"params": "parameter_count", "tokens": "train_tokens", "flops": "compute", "loss": "val_loss"}
    pts = points_lib.read_csv(path, columns=columns)
    np.testing.assert_array_equal(pts.params_P, n)
    np.testing.assert_array_equal(pts.flops_P, c)
    with pytest.raises(ConfigError, match="column 'tokens' is missing.*--columns=params=COLUMN"):
        points_lib.read_csv(path, columns={"loss": "val_loss"})
    with pytest.raises(ConfigError, match="names column 'n_params', which the file does not have"):
        points_lib.read_csv(path, columns={**columns, "params": "n_params"})
    with pytest.raises(ConfigError, match="--columns='size=parameter_count': expected NAME=COLUMN"):
        csv_checks.parse_columns(["size=parameter_count"])
    with pytest.raises(ConfigError, match=r"column 'train_tokens' \(--columns tokens=train_tokens\) = 1?\d\.\d+"):
        bad = write_csv(tmp_path / "bad.csv", ["parameter_count", "train_tokens", "val_loss"],
                        zip(n, np.log10(d), loss))
        points_lib.read_csv(bad, columns={"params": "parameter_count", "tokens": "train_tokens", "loss": "val_loss"})
    out = tmp_path / "out"
    proc = fit_cli(f"--points={path}", "--columns=params=parameter_count,tokens=train_tokens,flops=compute,"
                   "loss=val_loss", f"--out={out}", "--bootstrap=0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "fit.json").read_text())["approach2"]["a"] is not None


@pytest.mark.parametrize("jitter, seed", [(0.0, 0), (0.01, 13)])
def test_a_single_budget_is_a_fit_with_the_cannot_predict_note(tmp_path, jitter, seed):
    """One IsoFLOP budget: before, approach 1's power law through one compute value gave D_coef = inf and fit.json
    died in "Out of range float values are not JSON compliant: inf"; with the measured FLOPs 1% apart the budget
    split into two "budgets" 1.01x apart whose law had a = 17 and overflowed (OverflowError). Now approaches 1 and 2
    say why they cannot fit, the prediction is the documented "cannot predict" note, and the CLI exits 0."""
    n, d, c, loss = grid(budgets=(1e18,), sizes=8, jitter=jitter, seed=seed)
    path = write_csv(tmp_path / "one.csv", ["params", "tokens", "flops", "loss"], zip(n, d, c, loss))
    out = tmp_path / "out"
    proc = fit_cli(f"--points={path}", f"--out={out}", "--predict_flops=1e20", "--bootstrap=20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    fit = json.loads((out / "fit.json").read_text())
    assert fit["approach1"]["a"] is None and fit["approach2"]["a"] is None
    assert ("1.15x apart" if jitter else "needs at least 2") in fit["approach2"]["note"]
    assert fit["predictions"][0]["loss"] is None and fit["predictions"][0]["note"]
    assert "loss n/a" in proc.stdout


@pytest.mark.parametrize("design", ["two sizes per budget", "one size at six budgets", "five points"])
def test_too_few_sizes_is_a_fit_with_notes_not_a_traceback(tmp_path, design):
    """Designs too thin for approach 2 (or for any interval) are fitted as far as they go: fit.json (valid JSON, no
    inf), every figure, and the "cannot predict" note where there is no frontier."""
    if design == "two sizes per budget":
        n, d, c, loss = grid(sizes=2)
    elif design == "one size at six budgets":
        c = np.geomspace(1e17, 1e19, 6)
        n = np.full(6, 1e8)
        d = c / (6 * n)
        loss = law(n, d)
    else:
        n, d, c, loss = (x[:5] for x in grid(sizes=5))
    fit = report.run_fit(points_lib.from_arrays(n, d, loss, flops=c), str(tmp_path), bootstrap=20,
                         predict_flops=[1e21], predict_points=[(1e9, 2e10)])
    json.loads((tmp_path / "fit.json").read_text())
    assert fit["approach2"]["a"] is None and fit["predictions"][0]["loss"] is None
    assert fit["predictions"][0]["note"] and "loss n/a" in report.summary(fit)


def test_points_to_predict_off_the_scale_of_a_count_are_one_error(tmp_path):
    """`--predict_points` (and each row of `--predict_points_csv`) in the units of the points: a D given as log10 or
    an N in millions was predicted (a loss at 10 tokens); now one error naming the entry."""
    from transformer.scaling import at_points
    assert at_points.parse(["1e9:2e10"]) == [(1e9, 2e10)]
    for bad in ("1e9:10.3", "124:2e10"):
        with pytest.raises(ConfigError, match=rf"--predict_points: '{bad}' is off the plausible scale"):
            at_points.parse([bad])
    pairs = write_csv(tmp_path / "ask.csv", ["params", "tokens"], [(1e9, 2e10), (7e3, 1.4e4), (70, 1.4e12)])
    n, d, c, loss = grid()
    path = write_csv(tmp_path / "points.csv", ["params", "tokens", "flops", "loss"], zip(n, d, c, loss))
    proc = fit_cli(f"--points={path}", f"--predict_points_csv={pairs}", f"--out={tmp_path / 'out'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"--predict_points_csv={pairs}: '70:1400000000000.0' is off the plausible scale" in proc.stderr
    assert not (tmp_path / "out").exists()


def _plain_text(n, d, c, loss) -> str:
    return "params,tokens,flops,loss\n" + "".join(f"{float(a)!r},{float(b)!r},{float(f)!r},{float(l)!r}\n" for a, b, f, l in zip(n, d, c, loss))


@pytest.mark.parametrize("variant", [
    lambda t: "\ufeff" + t,  # Excel's "CSV UTF-8": a byte-order mark before the header
    lambda t: t.replace(",", "\t"),  # tab-separated
    lambda t: t.replace(",", ";"),  # a semicolon locale's export
    lambda t: t.replace("\n", "\r\n") + "\r\n\r\n",  # Windows line ends, trailing blank lines
    lambda t: t.replace("params,tokens,flops,loss", "Params,Tokens,FLOPs,Loss"),  # the names in another case
    lambda t: t.replace("\n", ",\n"),  # a trailing comma on every line
])
def test_a_spreadsheets_csv_reads_the_same_points(tmp_path, variant):
    """What a spreadsheet writes reads as the plain file does. Before: a byte-order mark, a tab or a semicolon made
    the header one unknown column ("column 'params' is missing"), and `Loss` was not `loss`."""
    n, d, c, loss = grid()
    (tmp_path / "plain.csv").write_text(_plain_text(n, d, c, loss))
    (tmp_path / "sheet.csv").write_bytes(variant(_plain_text(n, d, c, loss)).encode("utf-8"))
    plain, sheet = points_lib.read_csv(str(tmp_path / "plain.csv")), points_lib.read_csv(str(tmp_path / "sheet.csv"))
    for name in ("params_P", "tokens_P", "flops_P", "loss_P"):
        np.testing.assert_array_equal(getattr(sheet, name), getattr(plain, name))
    assert len(sheet) == len(n)


@pytest.mark.parametrize("text, message", [
    (b"params,tokens,loss\n1e6,2e7,3.1\n2e6,1e7,caf\xe9\n", r"line 3 is not UTF-8 text \(byte 0xe9\); save the file as UTF-8"),
    # an unquoted thousands separator shifts the row: before, the extra cell was dropped and the rest fitted
    (b"params,tokens,loss\n1e6,2e7,3.1\n2,000,000,1e7,3.0\n", r"row 3 has 5 cells and the header 3 names; quote"),
    (b"params,tokens,loss,params\n1e6,2e7,3.1,2e6\n", r"'params' \(column 1\) and 'params' \(column 4\) both read as params"),
    (b"Loss,params,tokens,LOSS\n3.1,1e6,2e7,3.2\n", r"'Loss' \(column 1\) and 'LOSS' \(column 4\) both read as loss"),
])
def test_a_file_the_reader_cannot_read_as_meant_is_one_error_naming_where(tmp_path, text, message):
    """Before: a Latin-1 byte was a UnicodeDecodeError traceback, and a row with more cells than the header or a
    header naming a column twice was read silently (the last of two columns won)."""
    (tmp_path / "bad.csv").write_bytes(text)
    with pytest.raises(ConfigError, match=message):
        points_lib.read_csv(str(tmp_path / "bad.csv"))


def test_predict_points_csv_reads_as_the_points_do(tmp_path):
    """`--predict_points_csv` goes through the same reader: a tab-separated file with `N`/`D` and a byte-order
    mark gives its pairs; a Latin-1 byte is one error, exit 2, and nothing written."""
    n, d, c, loss = grid()
    points = tmp_path / "points.csv"
    points.write_text(_plain_text(n, d, c, loss))
    asked = tmp_path / "asked.tsv"
    asked.write_bytes("\ufeffN\tD\n1e9\t2e10\n".encode("utf-8"))
    ok = fit_cli(f"--points={points}", f"--predict_points_csv={asked}", "--bootstrap=0", f"--out={tmp_path / 'ok'}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    predicted = json.loads((tmp_path / "ok" / "fit.json").read_text())["point_predictions"]["predictions"]
    assert [(p["params"], p["tokens"]) for p in predicted] == [(1e9, 2e10)]
    asked.write_bytes(b"params,tokens\n1e9,2e10 \xe9\n")
    bad = fit_cli(f"--points={points}", f"--predict_points_csv={asked}", f"--out={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "not UTF-8" in bad.stderr
    assert not (tmp_path / "bad").exists()
