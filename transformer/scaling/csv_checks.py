"""The checks a CSV of points passes before it is fitted, as published sweeps write them: the text read (UTF-8, a
spreadsheet's byte-order mark dropped, the delimiter a comma, a tab or a semicolon), column names mapped (`--columns`,
a required name in any case: `Loss`, `FLOPs`), numbers parsed, text columns told apart (a setting, a description, an identifier), duplicated rows
found, and the units checked. `points.read_csv` applies them in this order; nothing here knows `Points`.

Legend: P = rows kept.

Units: a CSV's params and tokens are counts and its flops a count of FLOPs (C ≈ 6·N·D). Published sweeps also
give GFLOPs or PF-days, log10 of a count, or millions of parameters; each of these lands far outside the ranges
below, and one error names the column instead of a fit with N_opt 2e5 and α = 16.
- params and tokens: at least MIN_COUNT (a log10 value is below 20; no language model in a scaling sweep has
  fewer than 1,000 parameters or sees fewer than 1,000 tokens), at most MAX_PARAMS / MAX_TOKENS;
- flops (when given): within a factor FLOPS_FACTOR of 6·N·D at every row. The conventions differ by less (attention
  FLOPs, a non-embedding N: up to ~40× for an embedding-dominated model of a few thousand parameters); a unit
  mistake by 1,000× or more;
- loss: at most MAX_LOSS nats (a uniform guess over a million tokens is 13.8: a larger value is a perplexity or a
  sum over a sequence).
"""
from __future__ import annotations

import csv
import io
import math
from collections import Counter
from typing import Sequence

import numpy as np

from transformer.spec import ConfigError

REQUIRED = ("params", "tokens", "loss")
NUMERIC = (*REQUIRED, "flops")
ALIASES = {"N": "params", "D": "tokens"}
DERIVABLE = {"tokens": "params", "params": "tokens"}  # may be absent where flops is given: C / (6·the other)
MIN_COUNT = 1e3
MAX_PARAMS = 1e15
MAX_TOKENS = 1e16
FLOPS_FACTOR = 100.0
MAX_LOSS = 20.0
MIN_SETTING_ROWS = 3  # a setting (one fit's rows) holds at least this many; a column whose values mostly hold fewer
# describes points
DELIMITERS = (",", "\t", ";")  # the first of these that the header line holds separates the columns


def read_table(path: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header's names (stripped) and the rows that are not blank, each (its line number, its cells stripped), of a
    CSV file: UTF-8 (a leading byte-order mark, as a spreadsheet's "CSV UTF-8" writes it, is dropped), the delimiter
    the first of `DELIMITERS` the header line holds. A row with more cells than the header (an unquoted "1,000", a
    shifted row) is one ConfigError naming it; empty cells past the header's end (trailing commas) are dropped."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # not "utf-8-sig": that codec
        # is imported on first use, which fails where the standard library cannot be read (run as another user)
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line} is not UTF-8 text (byte 0x{data[e.start]:02x}); save the file as "
                          "UTF-8 (a spreadsheet's \"CSV UTF-8\")") from None
    delimiter = next((d for d in DELIMITERS if d in text.split("\n", 1)[0]), ",")
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = [h.strip() for h in next(reader, [])]
    rows = []
    for cells in reader:
        cells = [c.strip() for c in cells]
        if not any(cells):
            continue  # a blank line
        if any(cells[len(header):]):
            raise ConfigError(f"{path}: row {reader.line_num} has {len(cells)} cells and the header {len(header)} "
                              f"names; quote a value with a {delimiter!r} in it (\"1,000\" or 1000) or name every "
                              "column in the header")
        rows.append((reader.line_num, cells[:len(header)]))
    return header, rows


def parse_columns(terms: Sequence[str]) -> dict[str, str]:
    """`["params=parameter_count", ...]` (`--columns`) as {"params": "parameter_count"}: which CSV column holds
    each of params, tokens, flops, loss."""
    columns: dict[str, str] = {}
    for term in terms:
        ours, sep, theirs = (s.strip() for s in term.partition("="))
        if not sep or not theirs or ours not in NUMERIC:
            raise ConfigError(f"--columns={term!r}: expected NAME=COLUMN with NAME one of {', '.join(NUMERIC)} "
                              "and COLUMN a column of the CSV, e.g. --columns=params=parameter_count,tokens=train_tokens")
        if ours in columns:
            raise ConfigError(f"--columns names {ours} twice ({columns[ours]!r} and {theirs!r})")
        columns[ours] = theirs
    return columns


def header_names(path: str, raw_header: Sequence[str], columns: dict[str, str]) -> list[str]:
    """The names the reader uses for the CSV's columns: a column `columns` maps takes its name (params, ...), `N`
    and `D` are params and tokens where the header has no params/tokens, one of params, tokens, flops, loss in
    another case (`Loss`, `FLOPs`) is that name where the header has no column of exactly that name, and a column a
    mapping replaces keeps its name with " (replaced by --columns)" (it is then ignored). A name the reader uses
    that two columns give is one ConfigError."""
    missing = [c for c in columns.values() if c not in raw_header]
    if missing:
        raise ConfigError(f"{path}: --columns names column {missing[0]!r}, which the file does not have; "
                          f"columns: {', '.join(raw_header)}")
    source_of = {theirs: ours for ours, theirs in columns.items()}
    names = []
    for h in raw_header:
        if h in source_of:
            names.append(source_of[h])
            continue
        name = ALIASES.get(h, h) if ALIASES.get(h) not in raw_header else h
        if name not in NUMERIC and name.lower() in NUMERIC and name.lower() not in raw_header:
            name = name.lower()
        names.append(f"{h} (replaced by --columns)" if name in columns else name)
    twice = [n for n in NUMERIC if names.count(n) > 1]
    if twice:
        given = [f"{h!r} (column {i + 1})" for i, (h, n) in enumerate(zip(raw_header, names)) if n == twice[0]]
        raise ConfigError(f"{path}: {' and '.join(given)} both read as {twice[0]}; rename or drop one of them")
    return names


def label(name: str, columns: dict[str, str]) -> str:
    """How an error names one of params, tokens, flops, loss: the CSV's own column where `columns` maps it."""
    return f"'{columns[name]}' (--columns {name}={columns[name]})" if name in columns else f"'{name}'"


def positive_number(path: str, line: int, column: str, text: str) -> float:
    """The cell as a positive finite number, or one ConfigError naming the row and column."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
        problem = "is not a number"
    else:
        problem = "is not a positive finite number"
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{path}: row {line}, column {column} = {text!r} {problem}; "
                          "params, tokens, flops and loss must be positive finite numbers")
    return value


def parse_where(terms: Sequence[str]) -> dict[str, str]:
    """`["col=value", ...]` as {col: value} (a value may hold commas); ConfigError on a malformed term."""
    where = {}
    for term in terms:
        column, sep, value = term.partition("=")
        if not sep or not column.strip():
            raise ConfigError(f"--where={term!r}: expected COLUMN=VALUE (repeat --where for more columns)")
        where[column.strip()] = value.strip()
    return where


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _cell(row: dict[str, str], column: str) -> str:
    return (row.get(column) or "").strip()


def settings(rows: list[dict[str, str]], columns: Sequence[str]) -> list[str]:
    """The distinct values of `columns` among `rows`, as 'col=value,...' strings (for error messages)."""
    return list(dict.fromkeys(",".join(f"{c}={_cell(r, c)}" for c in columns) for r in rows))


def _names_a_setting(rows: list[dict[str, str]], column: str) -> bool:
    """Whether `column` can tell settings apart: some model size (params) appears with two of its values. A
    column with one value per size (a model's name) describes the point, not a setting."""
    seen: dict[str, str] = {}
    return any(seen.setdefault(_cell(r, "params"), _cell(r, column)) != _cell(r, column) for r in rows)


def _per_point(rows: list[dict[str, str]], column: str) -> bool:
    """Whether most of `column`'s values hold fewer than MIN_SETTING_ROWS of `rows`: it describes points (a plot
    colour extracted with each point, a timestamp), since picking one of its values would leave nothing to fit."""
    counts = Counter(_cell(r, column) for r in rows)
    return len(rows) > 1 and float(np.median(list(counts.values()))) < MIN_SETTING_ROWS


def text_columns(header: Sequence[str], rows: list[dict[str, str]], kept: list[dict[str, str]],
                 where: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(the setting columns, the identifier columns, the per-point columns) among the text columns of the file's
    `rows`. A column whose values differ on every row `kept` (a run's name) is an identifier; one where most values
    hold fewer than MIN_SETTING_ROWS rows kept describes points (`_per_point`); one where some model size of the
    file appears under two of its values names a setting (dataset, experiment: one per fit); any other (a model's
    name, a comment) is ignored. A column `where` selects on is a setting."""
    texts = [c for c in header if c not in NUMERIC and any(not _is_number(_cell(r, c)) for r in rows)]
    identifiers = [c for c in texts if c not in where and len(kept) > 1
                   and len({_cell(r, c) for r in kept}) == len(kept)]
    per_point = [c for c in texts if c not in where and c not in identifiers and _per_point(kept, c)]
    setting = [c for c in texts if c not in identifiers + per_point and (c in where or _names_a_setting(rows, c))]
    return setting, identifiers, per_point


def duplicates(values_VP: np.ndarray) -> list[tuple[int, int]]:
    """(row, first row with the same values) for every row whose values (each column of `values_VP` (V, P): params,
    tokens, flops, loss) equal an earlier row's."""
    first: dict[tuple[float, ...], int] = {}
    out = []
    for p, key in enumerate(map(tuple, np.asarray(values_VP).T)):
        if key in first:
            out.append((p, first[key]))
        else:
            first[key] = p
    return out


def _rows(where_P: np.ndarray, lines: Sequence[int]) -> str:
    bad = np.flatnonzero(where_P)
    return ", ".join(str(lines[i]) for i in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")


def check_units(path: str, lines: Sequence[int], arrays: dict[str, np.ndarray], flops_given: bool,
                columns: dict[str, str], derived: str | None = None) -> None:
    """One ConfigError naming the first column off its plausible scale (module docstring); `arrays` (P,) each,
    `lines` the rows' line numbers; `derived`: params or tokens where the file has no such column and it is
    flops / (6·the other) (its scale then checks the flops and the other column, and C ≈ 6·N·D holds by
    construction)."""
    ranges = {"params": (MIN_COUNT, MAX_PARAMS, "parameter counts (not millions, not log10)"),
              "tokens": (MIN_COUNT, MAX_TOKENS, "token counts (not billions, not log10)")}
    for name, (lo, hi, what) in ranges.items():
        off_P = (arrays[name] < lo) | (arrays[name] > hi)
        if off_P.any():
            i = int(np.argmax(off_P))
            named = label(name, columns)
            if name == derived:
                named = f"'{name}' (not in the file: flops / (6·{DERIVABLE[name]}))"
                what = f"flops as FLOPs (not GFLOPs, PF-days or log10) and {DERIVABLE[name]} as counts"
            raise ConfigError(f"{path}: column {named} = {arrays[name][i]:g} at row {lines[i]} "
                              f"(rows {_rows(off_P, lines)}) is off the plausible scale [{lo:g}, {hi:g}]: give "
                              f"{what}")
    if flops_given and derived is None:
        ratio_P = arrays["flops"] / (6.0 * arrays["params"] * arrays["tokens"])
        off_P = (ratio_P > FLOPS_FACTOR) | (ratio_P < 1.0 / FLOPS_FACTOR)
        if off_P.any():
            i = int(np.argmax(off_P))
            raise ConfigError(f"{path}: column {label('flops', columns)} is {ratio_P[i]:.3g} × 6·params·tokens at "
                              f"row {lines[i]} (rows {_rows(off_P, lines)}); a run's compute is C ≈ 6·N·D within a "
                              f"factor of {FLOPS_FACTOR:g}: give FLOPs (not GFLOPs, PF-days or log10), or params "
                              "and tokens as counts")
    off_P = arrays["loss"] > MAX_LOSS
    if off_P.any():
        i = int(np.argmax(off_P))
        raise ConfigError(f"{path}: column {label('loss', columns)} = {arrays['loss'][i]:g} at row {lines[i]} (rows "
                          f"{_rows(off_P, lines)}) is above {MAX_LOSS:g} nats: give the loss per token in nats, not a "
                          "perplexity or a sum over a sequence")
