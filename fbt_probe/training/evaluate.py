"""Evaluation of a trained model: answer accuracy per task × length × decoding mode, validation loss
per pass, and the contraction diagnostic of Fig. 3.

Answer accuracy reads the greedy prediction at the shared final colon (the answer word is the
first generated token). For that first token Std and Soft decoding are identical by definition
(both prefill the prompt without feedback; Soft only feeds back from the first generated token on),
so the table reports the prefill modes: `standard` (= Std = Soft), `jacobi:2` (= Fused),
`recurrent:1` (the paper's probing mode), and `jacobi:3`, `full` (past the trained depth)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from fbt_probe.engine.schedule import jacobi_chunks
from fbt_probe.model.loss import weighted_ce
from fbt_probe.tasks import generate, load_spec
from fbt_probe.tasks.tokenizer import answer_ids
from fbt_probe.training.config import TRAIN_KNOBS, TrainConfig
from fbt_probe.training.data import heldout, validation_batch
from fbt_probe.training.lm import heldout_windows

EVAL_MODES = ("standard", "jacobi:2", "recurrent:1", "jacobi:3", "full")
DECODING_OF_MODE = {
    "standard": "Std/Soft",
    "jacobi:2": "Fused",
    "recurrent:1": "recurrent:1",
    "jacobi:3": "jacobi:3",
    "full": "full",
}


def eval_samples(
    cfg: TrainConfig,
    tokenizer,
    pairs: int = 32,
    knobs: dict | None = None,
    seed: int = 10_000,
    contexts=None,
    option: str = "pairs",
) -> pd.DataFrame:
    """`pairs` minimal pairs per task x length cell, drawn only from contexts held out of training:
    one pair from each of as many groups, so a register cell mixes many schedules. The k-th group
    of a cell gives its pair k mod (pairs in the group), so every kind of pair a group holds is
    asked about: every query register of a register group (its first pair would always be
    `query = r0`), and both `required` counts of a completion group (its first pair would always
    have required = the smaller count). A memory group holds one pair per length. `contexts`
    (default: `cfg`'s held-out split) restricts the contexts drawn from; `option` names `pairs` in a
    refusal or a note (a command's option)."""
    knobs = knobs or cfg.knobs or TRAIN_KNOBS
    frames = []
    for task in cfg.tasks:
        spec = dataclasses.replace(load_spec(task), length_grid=tuple(knobs[task]))
        df = generate(
            spec, groups=pairs, seed=seed, tokenizer=tokenizer, contexts=contexts or heldout(cfg), option=option
        )
        frames.append(_one_pair_per_group(df).groupby("length_knob", sort=False).head(2 * pairs))
    return pd.concat(frames, ignore_index=True)


def _one_pair_per_group(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of one pair per (length knob, group): pair k mod (pairs in the group), in pair-id
    order, of the k-th group of the cell (in order of appearance)."""
    pairs = df.groupby(["length_knob", "group_id"], sort=False)["pair_id"]
    rank = pairs.rank(method="dense").astype(int) - 1  # the pair's index in its group
    group_k = df.groupby("length_knob", sort=False)["group_id"].transform(
        lambda g: pd.factorize(g)[0]
    )  # k of the group in its cell
    return df[rank == group_k % pairs.transform("nunique")]


@torch.no_grad()
def _answer_ids(samples: pd.DataFrame, tokenizer) -> np.ndarray:
    """Each row's answer token: its label word as the tokenizer encodes it after the query (in a BPE,
    the word with its leading space), -1 where that is not one token."""
    ids = {}
    for (task, word), cell in samples.groupby(["task", "label_word"], sort=False):
        full, pos = answer_ids(tokenizer, cell["text"].iloc[0], word)
        ids[(task, word)] = -1 if pos is None else full[pos]
    return np.array([ids[key] for key in zip(samples["task"], samples["label_word"])], dtype=np.int64)


def answer_accuracy(model, samples: pd.DataFrame, tokenizer, modes=EVAL_MODES, batch: int = 64) -> pd.DataFrame:
    """One row per task × length_knob × mode: accuracy of the greedy answer at the final colon, and
    `groups`, the distinct groups the cell's samples come from (with `group_id` in `samples`)."""
    answer = _answer_ids(samples, tokenizer)
    device = next(model.parameters()).device
    rows = []
    for (task, knob, n_tok), cell in samples.groupby(["task", "length_knob", "n_tokens"], sort=True):
        toks = torch.tensor(cell["token_ids"].tolist(), dtype=torch.long, device=device)
        for mode in modes:
            preds = torch.cat(
                [model(toks[i : i + batch], mode=mode)[:, -1].argmax(-1) for i in range(0, len(toks), batch)]
            ).cpu()
            hits = preds.numpy() == answer[cell.index.to_numpy()]
            rows.append(
                {
                    "task": task,
                    "length_knob": int(knob),
                    "mode": mode,
                    "decoding": DECODING_OF_MODE.get(mode, mode),
                    "correct": int(hits.sum()),
                    "n": len(hits),
                }
            )
    df = pd.DataFrame(rows).groupby(["task", "length_knob", "mode", "decoding"], as_index=False)[["correct", "n"]].sum()
    df["accuracy"] = df["correct"] / df["n"]
    if "group_id" in samples.columns:  # the independent unit of the cell: the two samples of a pair share a context
        groups = samples.groupby(["task", "length_knob"])["group_id"].nunique().rename("groups").reset_index()
        df = df.merge(groups, on=["task", "length_knob"], how="left")
    return df


@torch.no_grad()
def contraction(
    model, tokens: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, n_passes: int = 32
) -> pd.DataFrame:
    """Validation loss after k = 1..N Jacobi feedback passes and ‖s^(k) − s^(k−1)‖ (mean over
    positions of the L2 norm of the change of the carried state). A contracting map's loss stays
    flat and its state change decays; a diverging one oscillates."""
    return contraction_by_document(model, tokens, targets, weights, n_passes)[0]


@torch.no_grad()
def contraction_by_document(
    model, tokens: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, n_passes: int = 32
) -> tuple[pd.DataFrame, np.ndarray]:
    """`contraction`'s table and [passes, documents] each document's mean state change at each pass
    (NaN at pass 1): the table's `state_change` is the mean over documents of that array (every row
    has the same padded length)."""
    device = next(model.parameters()).device
    tokens, targets, weights = tokens.to(device), targets.to(device), weights.to(device)
    answer = (weights > 0) & (
        weights == weights.max(-1, keepdim=True).values
    )  # the up-weighted answer position of each row
    has = torch.arange(tokens.shape[1], device=device) >= 1
    states, prev, rows = None, None, []
    by_doc = np.full((n_passes, tokens.shape[0]), np.nan)
    for chunk, _ in jacobi_chunks(tokens.shape[1], n_passes, every=False):  # the Jacobi iteration, hooks off
        k = chunk.pass_index
        state, logits = model.feedback_pass(tokens, states, None if states is None else has)
        delta = float("nan")
        if prev is not None:
            change = (state - prev).norm(dim=-1)
            delta = change.mean().item()
            by_doc[k - 1] = change.mean(-1).double().cpu().numpy()
        rows.append(
            {
                "pass": k,
                "val_loss": weighted_ce(logits, targets, (weights > 0).float()).item(),
                "answer_loss": weighted_ce(logits, targets, answer.float()).item(),
                "answer_accuracy": (logits.argmax(-1) == targets)[answer].float().mean().item(),
                "state_change": delta,
                "state_norm": state.norm(dim=-1).mean().item(),
            }
        )
        prev, states = state, model.shift_states(state)
    return pd.DataFrame(rows), by_doc


def ratio_interval(by_doc: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(last pass's state change over pass 2's, percentile-bootstrap 95 % low, high), the documents
    resampled (each a held-out context of its own)."""
    d2, last = by_doc[1], by_doc[-1]
    ratio = float(last.mean() / d2.mean())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d2), (n_boot, len(d2)))
    boots = last[idx].mean(1) / d2[idx].mean(1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return ratio, float(lo), float(hi)


@torch.no_grad()
def loss_per_pass(model, cfg: TrainConfig, tokenizer, max_passes: int = 3) -> dict:
    table = contraction(model, *validation_batch(cfg, tokenizer), n_passes=max_passes)
    return {f"val_loss_pass{int(r['pass'])}": r["val_loss"] for _, r in table.iterrows()}


VAL_ROWS = 64  # held-out files a corpus run's validation reads during training (the diagnostics read every one)


@torch.no_grad()
def corpus_loss_per_pass(model, cfg: TrainConfig, tokenizer=None, max_passes: int = 3) -> dict:
    """A corpus run's held-out loss after each of 1..`max_passes` feedback passes (`val_loss_pass{k}`)."""
    table = contraction(model, *heldout_windows(cfg, limit=VAL_ROWS), n_passes=max_passes)
    return {f"val_loss_pass{int(r['pass'])}": r["val_loss"] for _, r in table.iterrows()}


@torch.no_grad()
def pass_curves(model, tokens: torch.Tensor, targets: torch.Tensor, n_passes: int, batch: int = 16) -> dict:
    """Per held-out window d and Jacobi pass k = 1..N: `loss` [N, D] (the window's mean next-token
    loss after k passes: k − 1 feedback passes at prefill), `change` [N, D] (mean over positions of
    ‖s^(k) − s^(k−1)‖, NaN at k = 1) and `norm` [N, D] (mean ‖s^(k)‖). Windows run `batch` at a time;
    each window's iteration is its own, so the batching changes no number beyond float rounding."""
    import torch.nn.functional as F

    device = next(model.parameters()).device
    D = tokens.shape[0]
    out = {name: np.full((n_passes, D), np.nan) for name in ("loss", "change", "norm")}
    for lo in range(0, D, batch):
        tok, tgt = tokens[lo : lo + batch].to(device), targets[lo : lo + batch].to(device)
        has = torch.arange(tok.shape[1], device=device) >= 1
        states, prev = None, None
        for chunk, _ in jacobi_chunks(tok.shape[1], n_passes, every=False):  # the Jacobi iteration, hooks off
            k = chunk.pass_index
            state, logits = model.feedback_pass(tok, states, None if states is None else has)
            ce = F.cross_entropy(logits.float().transpose(1, 2), tgt, reduction="none").double().mean(-1)
            out["loss"][k - 1, lo : lo + batch] = ce.cpu().numpy()
            out["norm"][k - 1, lo : lo + batch] = state.norm(dim=-1).mean(-1).double().cpu().numpy()
            if prev is not None:
                out["change"][k - 1, lo : lo + batch] = (state - prev).norm(dim=-1).mean(-1).double().cpu().numpy()
            prev, states = state, model.shift_states(state)
    return out
