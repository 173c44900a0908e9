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
import torch.nn.functional as F

from fbt_probe.engine.hooks import silent
from fbt_probe.engine.walk import passes
from fbt_probe.model.loss import weighted_ce
from fbt_probe.tasks import generate, load_spec
from fbt_probe.tasks.tokenizer import answer_ids
from fbt_probe.training.config import DEFAULT_TASKS, TRAIN_KNOBS, TrainConfig
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


def task_config(cfg: TrainConfig) -> TrainConfig:
    """The config task samples are drawn with: the run's own, or for a corpus run (trained on no task)
    the four tasks' defaults, read in context in the corpus tokenizer."""
    return cfg if cfg.corpus is None else TrainConfig(preset=cfg.preset, tasks=DEFAULT_TASKS, seed=cfg.seed)


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


def _label_ids(samples: pd.DataFrame, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Each row's answer token (its label word as the tokenizer encodes it after the query: in a BPE,
    the word with its leading space) and the other label word's token (its task's label word that is
    not the row's answer); -1 where that is not one token."""
    ids, other = {}, {}
    for (task, word), cell in samples.groupby(["task", "label_word"], sort=False):
        full, pos = answer_ids(tokenizer, cell["text"].iloc[0], word)
        ids[(task, word)] = -1 if pos is None else full[pos]
    for task, cell in samples.groupby("task", sort=False):
        words = sorted(cell["label_word"].unique())
        if len(words) == 2:
            other[(task, words[0])], other[(task, words[1])] = ids[(task, words[1])], ids[(task, words[0])]
    keys = list(zip(samples["task"], samples["label_word"]))
    return (
        np.array([ids[k] for k in keys], dtype=np.int64),
        np.array([other.get(k, -1) for k in keys], dtype=np.int64),
    )


EVAL_TOKENS = 65_536  # tokens a forward of `answer_accuracy` holds at most (64 rows of the tasks up to 1,024)


@torch.no_grad()
def answer_accuracy(model, samples: pd.DataFrame, tokenizer, modes=EVAL_MODES, batch: int = 64) -> pd.DataFrame:
    """One row per task × length_knob × mode: accuracy of the greedy answer at the final colon
    (`correct`, `accuracy`: the top-1 token is the answer word), of the two-way choice between the
    label words (`choice_correct`, `choice_accuracy`: the answer word's logit above the other's, the
    measure for a model that may answer with other words, such as a general LM reading the task in
    context; chance 0.5), `answer_loss` (the mean cross-entropy of the answer token over the whole
    vocabulary, in nats: what training minimises at the answer; NaN where the answer word is not one
    token), and `groups`, the distinct groups the cell's samples come from (with
    `group_id` in `samples`). A forward takes `batch` rows, fewer where they would pass `EVAL_TOKENS`
    tokens (its logits are rows x tokens x vocabulary: a general LM's few-shot prompts)."""
    answer, other = _label_ids(samples, tokenizer)
    device = next(model.parameters()).device
    rows = []
    for (task, knob, n_tok), cell in samples.groupby(["task", "length_knob", "n_tokens"], sort=True):
        toks = torch.tensor(cell["token_ids"].tolist(), dtype=torch.long, device=device)
        idx = cell.index.to_numpy()
        rows_per = max(1, min(batch, EVAL_TOKENS // int(n_tok)))
        for mode in modes:
            last = torch.cat(
                [model(toks[i : i + rows_per], mode=mode)[:, -1] for i in range(0, len(toks), rows_per)]
            ).cpu()
            hits = last.argmax(-1).numpy() == answer[idx]
            rows_ = torch.arange(len(idx))
            own = torch.as_tensor(answer[idx])
            ce = torch.logsumexp(last.double(), -1) - last.double()[rows_, own.clamp(min=0)]
            ce = ce.where(own >= 0, torch.nan)  # a row whose answer is not one token
            chose = (
                (last[rows_, answer[idx]] > last[rows_, other[idx]]).numpy() & (answer[idx] >= 0) & (other[idx] >= 0)
            )
            rows.append(
                {
                    "task": task,
                    "length_knob": int(knob),
                    "mode": mode,
                    "decoding": DECODING_OF_MODE.get(mode, mode),
                    "correct": int(hits.sum()),
                    "choice_correct": int(chose.sum()),
                    "loss_sum": float(ce.sum()),
                    "n": len(hits),
                }
            )
    keys = ["task", "length_knob", "mode", "decoding"]
    sums = {c: (c, "sum") for c in ("correct", "choice_correct", "n")}
    # numpy's sum: a cell with a NaN row stays NaN (pandas' sum would skip it)
    df = (
        pd.DataFrame(rows)
        .groupby(keys, as_index=False)
        .agg(**sums, loss_sum=("loss_sum", lambda x: x.to_numpy().sum()))
    )
    df["accuracy"] = df["correct"] / df["n"]
    df["choice_accuracy"] = df["choice_correct"] / df["n"]  # the two label words' logits compared: chance 0.5
    # the training objective at the answer: cross-entropy of the answer token over the whole vocabulary
    df["answer_loss"] = df.pop("loss_sum") / df["n"]
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
    table, change, _, _ = contraction_documents(model, tokens, targets, weights, n_passes)
    return table, change


@torch.no_grad()
def contraction_documents(
    model, tokens: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, n_passes: int = 32
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """`contraction_by_document`'s table and state change [passes, documents], with each document's
    validation loss at each pass [passes, documents] and its loss weight [documents] (the positions
    the loss counts): the table's `val_loss` at a pass is Σ weight · loss / Σ weight over documents."""
    device = next(model.parameters()).device
    tokens, targets, weights = tokens.to(device), targets.to(device), weights.to(device)
    answer = (weights > 0) & (
        weights == weights.max(-1, keepdim=True).values
    )  # the up-weighted answer position of each row
    rows, by_doc = [], np.full((n_passes, tokens.shape[0]), np.nan)
    loss_doc = np.full((n_passes, tokens.shape[0]), np.nan)
    counted = (weights > 0).float()
    doc_weight = counted.sum(-1).double().cpu().numpy()

    def record(chunk, state, logits, prev):
        change = None if prev is None else (state - prev).norm(dim=-1)
        if change is not None:
            by_doc[chunk.pass_index - 1] = change.mean(-1).double().cpu().numpy()
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none").view(
            targets.shape
        )
        loss_doc[chunk.pass_index - 1] = ((ce * counted).sum(-1) / counted.sum(-1).clamp_min(1)).cpu().numpy()
        rows.append(
            {
                "pass": chunk.pass_index,
                "val_loss": weighted_ce(logits, targets, counted).item(),
                "answer_loss": weighted_ce(logits, targets, answer.float()).item(),
                "answer_accuracy": (logits.argmax(-1) == targets)[answer].float().mean().item(),
                "state_change": float("nan") if change is None else change.mean().item(),
                "state_norm": state.norm(dim=-1).mean().item(),
            }
        )

    passes(model, tokens, n_passes, silent, each=record)  # the Jacobi iteration, hooks off
    return pd.DataFrame(rows), by_doc, loss_doc, doc_weight


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


VAL_ROWS = 64  # held-out files a corpus run's validation reads during training (the diagnostics read every one)


@torch.no_grad()
def loss_per_pass(model, cfg: TrainConfig, tokenizer, max_passes: int = 3, corpus: bool = False) -> dict:
    """Validation loss after each of 1..`max_passes` feedback passes (`val_loss_pass{k}`): on held-out
    task documents, or (`corpus`) a corpus run's first VAL_ROWS held-out windows."""
    rows = heldout_windows(cfg, limit=VAL_ROWS) if corpus else validation_batch(cfg, tokenizer)
    table = contraction(model, *rows, n_passes=max_passes)
    return {f"val_loss_pass{int(r['pass'])}": r["val_loss"] for _, r in table.iterrows()}


@torch.no_grad()
def pass_curves(model, tokens: torch.Tensor, targets: torch.Tensor, n_passes: int, batch: int = 16) -> dict:
    """Per held-out window d and Jacobi pass k = 1..N: `loss` [N, D] (the window's mean next-token
    loss after k passes: k − 1 feedback passes at prefill), `change` [N, D] (mean over positions of
    ‖s^(k) − s^(k−1)‖, NaN at k = 1) and `norm` [N, D] (mean ‖s^(k)‖). Windows run `batch` at a time;
    each window's iteration is its own, so the batching changes no number beyond float rounding."""
    device = next(model.parameters()).device
    D = tokens.shape[0]
    out = {name: np.full((n_passes, D), np.nan) for name in ("loss", "change", "norm")}
    for lo in range(0, D, batch):
        tgt = targets[lo : lo + batch].to(device)

        def record(chunk, state, logits, prev):
            k, rows = chunk.pass_index - 1, slice(lo, lo + batch)
            ce = F.cross_entropy(logits.float().transpose(1, 2), tgt, reduction="none").double().mean(-1)
            out["loss"][k, rows] = ce.cpu().numpy()
            out["norm"][k, rows] = state.norm(dim=-1).mean(-1).double().cpu().numpy()
            if prev is not None:
                out["change"][k, rows] = (state - prev).norm(dim=-1).mean(-1).double().cpu().numpy()

        passes(model, tokens[lo : lo + batch].to(device), n_passes, silent, each=record)  # hooks off
    return out
