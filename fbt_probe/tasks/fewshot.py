"""Few-shot prompts: solved examples of a task written before each of its samples.

A model that never trained on the tasks (a general language model reads them in context) may answer
at chance zero-shot because it does not know that a label word is expected after the query. With
`shots` N, every sample of a task gets the same prefix: N solved examples of that task, each its
text, a space, its label word and a blank line, drawn from groups that are not among the samples'
(a different seed, the task's shortest length), the label words alternating so that the prefix
favours neither answer. The prefix's token ids are put before the sample's own (a tokenizer that
starts every text with a BOS keeps one, at the front), so both samples of a minimal pair stay equal
in length and end in the same token, and the tokens of the sample itself are unchanged.
"""

from __future__ import annotations

import dataclasses
import warnings

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.tasks.generators import generate
from fbt_probe.tasks.spec import load_spec
from fbt_probe.tasks.tokenizer import encode

MAX_SHOTS = 16
DEMO_SEED = 20_000  # the demonstrations' generation seed (the evaluation draws its samples with others)
DEMO_GROUPS = 64  # groups drawn to pick the demonstrations from (those among the samples' left out)


def demonstrations(
    task: str, shots: int, tokenizer, exclude: set[str], seed: int = DEMO_SEED
) -> list[tuple[str, str, str]]:
    """`shots` solved examples (text, label word, group id) of `task` at its shortest length, from
    groups not in `exclude` (at the next length where the shortest has too few), one a group, the
    label words alternating (the spec's first one first)."""
    spec = load_spec(task)
    need = -(-shots // len(spec.label_words))  # demonstrations of each label word
    firsts = pd.DataFrame()
    for knob in sorted(spec.length_grid):  # the shortest length first; longer ones where it has too few groups
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a cell with fewer distinct groups than asked for is capped: expected
            df = generate(
                dataclasses.replace(spec, length_grid=(knob,)), groups=DEMO_GROUPS, seed=seed, tokenizer=tokenizer
            )
        df = df[~df["group_id"].isin(exclude)].drop_duplicates("group_id")  # one sample a group
        firsts = pd.concat([firsts, df], ignore_index=True)
        if (firsts.groupby("label_word").size().reindex(list(spec.label_words), fill_value=0) >= need).all():
            break
    words = list(spec.label_words)  # label 0's word first
    by_word = {w: list(zip(*(firsts.loc[firsts["label_word"] == w, c] for c in ("text", "group_id")))) for w in words}
    out = []
    for i in range(shots):
        word = words[i % len(words)]
        pool = by_word[word]
        if i // len(words) >= len(pool):
            raise FbtError(f"--shots {shots}: task {task} has only {len(pool)} demonstration groups for '{word}'")
        text, group = pool[i // len(words)]
        out.append((text, word, group))
    return out


def prefix_text(demos: list[tuple]) -> str:
    """The demonstrations (text, label word, ...) as text: each its text, a space, its label word,
    then a blank line."""
    return "".join(f"{d[0]} {d[1]}\n\n" for d in demos)


def check_shots(shots) -> None:
    """A shot count is an integer 0..MAX_SHOTS; otherwise one line naming `--shots`."""
    if isinstance(shots, bool) or not isinstance(shots, int) or not 0 <= shots <= MAX_SHOTS:
        raise FbtError(f"--shots {shots!r}: expected an integer 0..{MAX_SHOTS} (solved examples before each sample)")


def with_shots(samples: pd.DataFrame, tokenizer, shots: int, seed: int = DEMO_SEED) -> pd.DataFrame:
    """`samples` (a dataset or `eval_samples` frame) with `shots` demonstrations before each sample:
    `text`, `token_ids` and `n_tokens` rewritten, `shots` recorded in a column; 0 returns the frame
    unchanged but for that column."""
    check_shots(shots)
    out = samples.copy()
    out["shots"] = shots
    if shots == 0:
        return out
    lead = len(encode(tokenizer, [""])[0])  # the ids a tokenizer puts before every text (a BOS), kept once
    for task, rows in samples.groupby("task", sort=False):
        demos = demonstrations(task, shots, tokenizer, set(samples["group_id"]), seed)
        text = prefix_text(demos)
        ids = encode(tokenizer, [text])[0]
        out.loc[rows.index, "text"] = [text + t for t in rows["text"]]
        out.loc[rows.index, "token_ids"] = pd.Series(
            [ids + list(t)[lead:] for t in rows["token_ids"]], index=rows.index
        )
    out["n_tokens"] = out["token_ids"].map(len)
    return out
