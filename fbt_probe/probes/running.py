"""The running state of a one-token-a-step compose task, read by a probe at every step.

chain-s3 and chain-a5 (`inline_steps`) move a point through k permutations, one token a step; after
step j the point is p_j (`tasks.checker.compose_points`, from the text alone). A model that composes
step by step holds p_j at step j's token at some depth, and a serial recurrence carries it to the
next position. For each step j and probe depth d a multinomial linear probe reads p_j from the
residual stream at step j's token under a prefill mode, fitted on grouped folds (a group is the
word, so no word is on both sides) and scored on the held-out folds: accuracy with the Wilson
interval at n = the groups, beside chance (the commonest point's share at that step)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import torch

from fbt_probe.errors import FbtError
from fbt_probe.hooks import depth_name
from fbt_probe.modes import parse_mode
from fbt_probe.probes.estimator import LinearProbe
from fbt_probe.probes.splits import grouped_folds
from fbt_probe.stats import group_wilson
from fbt_probe.tasks.checker import compose_points

COLUMNS = ["mode", "length_knob", "step", "depth", "accuracy", "ci_low", "ci_high", "chance", "n_samples", "n_groups"]


def step_positions(spec, tok, text: str, token_ids) -> list[int]:
    """The token index of each step's word in `token_ids` (the sample's tokens of `text`, after any
    special tokens the tokenizer puts first): the last token of the text up to and including that
    word, which must tokenize as a prefix of the sample and add exactly one token to the text before
    it (the spec's promise of one token a step)."""
    if spec.kind != "compose" or not spec.inline_steps:
        raise FbtError(f"{spec.task}: the running state is read on a compose task with one word a step (inline_steps)")
    encode = lambda t: tok.encode(t, add_special_tokens=False).ids  # noqa: E731
    ids = list(token_ids)
    off = len(ids) - len(encode(text))  # special tokens first (a BOS), if the tokenizer adds any
    start, words = text.split("\n")[:2]
    words = words.split(" ")
    out, before = [], len(encode(start + "\n"))
    for j in range(1, len(words) + 1):
        head = encode(start + "\n" + " ".join(words[:j]))
        if off < 0 or head != ids[off : off + len(head)]:
            raise FbtError(f"{spec.task}: the text up to step {j} does not tokenize as a prefix of its sample")
        if len(head) != before + 1:
            raise FbtError(f"{spec.task}: step {j}'s word is not one token in this tokenizer")
        out.append(off + len(head) - 1)
        before = len(head)
    return out


def step_cells(df: pd.DataFrame, spec, tok) -> dict:
    """length knob -> (cell, step token positions [N, k], points [N, k + 1], groups [N]): what every
    mode's activations are read at, independent of the mode."""
    out = {}
    for knob, cell in df.groupby("length_knob", sort=True):
        cell = cell.reset_index(drop=True)
        pos = np.array([step_positions(spec, tok, t, ids) for t, ids in zip(cell["text"], cell["token_ids"])])
        points = np.array([compose_points(spec, t) for t in cell["text"]])
        out[int(knob)] = (cell, pos, points, cell["group_id"].astype(str).to_numpy())
    return out


def running_activations(
    model, df: pd.DataFrame, spec, tok, mode: str, depths, batch_size: int = 32, cells: dict | None = None
) -> dict:
    """length knob -> (acts [depths, N, k, d] float64, points [N, k + 1], groups [N]): the residual
    stream at every step's token under `mode`, one run with cache per batch of equal length.
    `cells`: `step_cells(df, spec, tok)`, already taken (the same for every mode)."""
    names = [depth_name(d) for d in depths]
    m = parse_mode(mode)
    out = {}
    for knob, (cell, pos, points, groups) in (cells or step_cells(df, spec, tok)).items():
        chunks = []
        for lo in range(0, len(cell), batch_size):
            tokens = torch.tensor(np.stack(cell["token_ids"].iloc[lo : lo + batch_size].to_numpy()))
            with torch.no_grad():
                _, cache = model.run_with_cache(tokens, mode=m, names_filter=lambda n: n in names)
            rows = torch.arange(len(tokens))[:, None]
            at = torch.as_tensor(pos[lo : lo + batch_size])
            chunks.append(torch.stack([cache[n][rows, at].double() for n in names]))
        out[knob] = (torch.cat(chunks, 1).cpu().numpy(), points, groups)
    return out


def running_probes(
    acts: np.ndarray, points: np.ndarray, groups: np.ndarray, depths, n_folds: int = 4, seed: int = 0, C: float = 1.0
) -> pd.DataFrame:
    """Held-out accuracy of a probe for p_j at step j's token, per depth and step (see module doc).
    acts [depths, N, k, d]; points [N, k + 1] (p_0 first); groups [N]."""
    rows = []
    k = acts.shape[2]
    for j in range(1, k + 1):
        y = points[:, j]
        chance = float(np.bincount(y).max() / len(y))
        if len(np.unique(y)) < 2 or len(np.unique(groups)) < 2:
            continue  # one point at this step in every sample, or one word: nothing to read
        with warnings.catch_warnings():  # a point held by fewer words than folds: the folds still keep words apart
            warnings.filterwarnings("ignore", "The least populated class", UserWarning)
            splits = grouped_folds(y, groups, n_folds, seed)
        for i, d in enumerate(depths):
            X = acts[i, :, j - 1]
            hit = np.full(len(y), np.nan)
            for train, test in splits:
                hit[test] = LinearProbe(C=C).fit(X[train], y[train]).predict(X[test]) == y[test]
            kept = ~np.isnan(hit)
            n_groups = len(np.unique(groups[kept]))
            p, lo, hi = group_wilson(float(hit[kept].mean()), n_groups)
            rows.append(
                dict(
                    step=j,
                    depth=int(d),
                    accuracy=p,
                    ci_low=lo,
                    ci_high=hi,
                    chance=chance,
                    n_samples=int(kept.sum()),
                    n_groups=n_groups,
                )
            )
    return pd.DataFrame(rows)


def activations_by_mode(model, df: pd.DataFrame, spec, tok, modes, depths=None) -> tuple[list[int], dict]:
    """(depths, {mode name: `running_activations`}): every depth where `depths` is None; what the
    probe table and the lens table (`lens.running`) both read, taken once, the step positions and
    points once for every mode."""
    depths = list(range(model.cfg.n_layers + 1)) if depths is None else list(depths)
    cells = step_cells(df, spec, tok)  # the steps' positions and points, read once for every mode
    return depths, {
        str(parse_mode(m)): running_activations(model, df, spec, tok, m, depths, cells=cells) for m in modes
    }


def running_state(
    model,
    df: pd.DataFrame,
    spec,
    tok,
    modes=("standard", "full"),
    depths=None,
    n_folds: int = 4,
    seed: int = 0,
    activations: tuple | None = None,
) -> pd.DataFrame:
    """The running-state table of `df` (one compose task) under each mode: a row per mode x length
    knob x step x depth (`COLUMNS`). `activations`: `activations_by_mode`'s, already taken."""
    depths, by_mode = activations or activations_by_mode(model, df, spec, tok, modes, depths)
    frames = []
    for mode, by_knob in by_mode.items():
        for knob, (acts, points, groups) in by_knob.items():
            t = running_probes(acts, points, groups, depths, n_folds, seed)
            frames.append(t.assign(mode=mode, length_knob=knob))
    t = pd.concat(frames, ignore_index=True)[COLUMNS] if frames else pd.DataFrame(columns=COLUMNS)
    ints = ["length_knob", "step", "depth", "n_samples", "n_groups"]
    return t.astype({c: "int64" for c in ints})
