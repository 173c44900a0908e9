"""Side-by-side text rendering of minimal pairs for `fbt-probe tasks show`."""

from __future__ import annotations

import pandas as pd


def _shorten(lines: list[str], max_lines: int) -> list[str]:
    if len(lines) <= max_lines:
        return lines
    head, tail = max_lines // 2, max_lines - max_lines // 2 - 1
    return lines[:head] + [f"... {len(lines) - head - tail} more lines ..."] + lines[len(lines) - tail :]


def format_pair(a: pd.Series, b: pd.Series, max_lines: int = 12) -> str:
    """Two samples side by side; '|' between columns, '*' where the two lines differ."""
    la, lb = a.text.split("\n"), b.text.split("\n")
    marks = ["*" if x != y else " " for x, y in zip(la, lb)] + ["*"] * abs(len(la) - len(lb))
    rows = list(zip(la + [""] * (len(lb) - len(la)), lb + [""] * (len(la) - len(lb)), marks))
    rows = [r if isinstance(r, tuple) else (r, "", " ") for r in _shorten(rows, max_lines)]
    width = max([len(x) for x, _, _ in rows] + [24])
    head = [f"pair {a.pair_id}  {a.task}  length knob {a.length_knob}", f"  groups: {a.group_id} | {b.group_id}"]
    body = [f"  {x:<{width}} {m}| {y}" for x, y, m in rows]
    foot = [
        f"  {'-> ' + a.label_word + f' ({a.label}), {a.n_tokens} tokens':<{width}}  | -> {b.label_word} ({b.label}), {b.n_tokens} tokens"
    ]
    return "\n".join(head + body + foot)


def format_pairs(df: pd.DataFrame, n: int = 3, knob: int | None = None, max_lines: int = 12) -> str:
    if knob is not None:
        df = df[df.length_knob == knob]
    blocks = []
    for _, pair in list(df.groupby("pair_id", sort=False))[:n]:
        blocks.append(format_pair(pair.iloc[0], pair.iloc[1], max_lines))
    return "\n\n".join(blocks)
