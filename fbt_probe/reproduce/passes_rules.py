"""The general language model's rules: Fig. 3 (does the iteration contract, per run, and does the 3 %
of three-pass batches make the difference, over seeds) and Fig. 4 (does held-out loss fall with
feedback passes at prefill, and is the gain front-loaded). Each reads per-document arrays (one
held-out file is one document, the resampling unit) and never a single number: a verdict needs its
interval on one side of its threshold, else it is "cannot say"; over seeds a verdict is stated only
where it holds on every seed. Nothing here reads files or runs a model (tests/test_passes_rules.py).

| rule          | arrays it reads (passes x documents)                    | verdicts                                           |
|---------------|---------------------------------------------------------|----------------------------------------------------|
| fig3-run      | loss rise and state-change ratios (intervals), one run   | contracts (plateau / still decaying) / converges to a worse state / diverges / cannot say |
| three-pass    | fig3-run's verdict per seed for 75/22/3 and for 75/25    | the 3 % turns divergence into contraction on every seed / on m of n / ... |
| fig4          | loss per pass (feedback model), pass 1 (baseline)        | falls with passes (front-loaded or not) / does not fall / cannot say |
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fbt_probe.stats import LEVEL, N_BOOT, group_weights

FLAT_LOSS = 0.1  # nats: the loss at the last pass within this of pass 1's (the interval's upper end) is "stable"
DECAYED = 0.5  # the tail's state change below this share of the early passes' (interval's upper end): "decays"
PLATEAU = 0.5  # the tail's change below this share of the middle passes' (upper end): "still decaying", else a plateau
EARLY, MIDDLE, TAIL = (2, 4), (9, 16), (25, 32)  # passes (inclusive) whose mean state change the rule compares
MIN_DOCUMENTS = 8  # no verdict rests on fewer held-out documents
# the state change decays (the map converges) while the loss climbs: a fixed point, but a worse one than pass 1
SETTLES = "converges to a state whose loss is higher"

CRITERIA = {
    "fig3-run": (
        f"a run's iteration contracts when, over held-out documents (percentile bootstrap, 95 %), the loss "
        f"after {TAIL[1]} passes exceeds the loss after one by less than {FLAT_LOSS} nats (the interval's upper "
        f"end) and the mean state change over passes {TAIL[0]}-{TAIL[1]} is below {DECAYED} of its mean over "
        f"passes {EARLY[0]}-{EARLY[1]} (the ratio's upper end); it is still decaying when the change over "
        f"passes {TAIL[0]}-{TAIL[1]} is below {PLATEAU} of passes {MIDDLE[0]}-{MIDDLE[1]}'s (upper end), and has "
        f"reached a plateau otherwise. It converges to a state whose loss is higher when the loss rise's lower end is "
        f"above {FLAT_LOSS} nats while the state change decays (the ratio's upper end below {DECAYED}: the paper's "
        f"flat loss is then not reached, though the map has a fixed point); it diverges when the state-change "
        f"ratio's lower end is above 1, or the loss rises while the ratio's lower end is above {DECAYED}; "
        f"otherwise the table cannot say"
    ),
    "three-pass": (
        "the 3 % of three-pass batches is said to turn divergence into a contraction only when, on every "
        "training seed, the 75/22/3 run contracts and the 75/25 run diverges; otherwise the sentence gives "
        "each seed's verdicts"
    ),
    "fig4": (
        "held-out loss falls with feedback passes at prefill when the paired drop from 0 to 4 passes (per "
        "document) has its interval above 0 on every seed; the gain is front-loaded when the first pass's "
        "drop exceeds the drop of passes 2-4 together (interval of the difference above 0) on every seed"
    ),
}


@dataclass(frozen=True)
class Verdict:
    rule: str
    verdict: str
    sentence: str


def _boot(values: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of a per-document array: the percentile bootstrap over documents."""
    v = np.asarray(values, dtype=np.float64)
    W = group_weights(np.arange(v.size), n_boot, seed)
    means = W @ v / W.sum(1)
    a = (1 - LEVEL) / 2
    lo, hi = np.quantile(means, [a, 1 - a])
    return float(v.mean()), float(lo), float(hi)


def _ratio(num: np.ndarray, den: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(mean(num) / mean(den), low, high): a ratio of means over documents (never a mean of ratios,
    so no document's near-zero denominator drives it), percentile bootstrap over documents."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    W = group_weights(np.arange(num.size), n_boot, seed)
    boots = (W @ num) / (W @ den)
    a = (1 - LEVEL) / 2
    lo, hi = np.quantile(boots, [a, 1 - a])
    return float(num.mean() / den.mean()), float(lo), float(hi)


mean_interval, ratio_of_means = _boot, _ratio  # the task models' contraction reads them too (parts/contraction)


def window(change: np.ndarray, passes: tuple[int, int]) -> np.ndarray:
    """Each document's mean state change over passes a..b (1-based, inclusive)."""
    return np.nanmean(change[passes[0] - 1 : passes[1]], axis=0)


def fmt(t: tuple[float, float, float], digits: int = 2) -> str:
    v, lo, hi = t
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def fig3_numbers(loss: np.ndarray, change: np.ndarray) -> dict:
    """A run's Fig. 3 numbers from `loss` and `change` [passes, documents] (pass 1 first; at least
    TAIL[1] passes; NaN change at pass 1), each (value, low, high) over documents: `rise`, the loss
    after TAIL[1] passes minus after one; `decay`, the tail's mean state change over the early
    passes'; `level`, the tail's over the middle passes'."""
    n_pass, n_doc = loss.shape
    if n_pass < TAIL[1]:
        raise ValueError(f"fig3 needs at least {TAIL[1]} passes, got {n_pass}")
    return {
        "rise": _boot(loss[TAIL[1] - 1] - loss[0]),
        "decay": _ratio(window(change, TAIL), window(change, EARLY)),
        "level": _ratio(window(change, TAIL), window(change, MIDDLE)),
        "documents": n_doc,
    }


def fig3_run(label: str, numbers: dict) -> Verdict:
    """One run's Fig. 3 verdict from its `fig3_numbers` (intervals only: a seeds table's rows suffice)."""
    n_doc = numbers["documents"]
    if n_doc < MIN_DOCUMENTS:
        return Verdict(
            "fig3-run", "cannot say", f"{label}: {n_doc} held-out documents (too few; at least {MIN_DOCUMENTS})"
        )
    rise, decay, level = numbers["rise"], numbers["decay"], numbers["level"]
    if decay[1] > 1 or (rise[1] > FLAT_LOSS and decay[1] > DECAYED):
        verdict = "diverges"
    elif rise[1] > FLAT_LOSS and decay[2] < DECAYED:
        verdict = SETTLES
    elif rise[2] < FLAT_LOSS and decay[2] < DECAYED:
        verdict = "contracts, still decaying" if level[2] < PLATEAU else "contracts to a plateau"
    else:
        verdict = "cannot say"
    text = (
        f"{label}: the loss after {TAIL[1]} passes minus after one is {fmt(rise)} nats, the state change over "
        f"passes {TAIL[0]}-{TAIL[1]} is {fmt(decay)} of passes {EARLY[0]}-{EARLY[1]}'s and {fmt(level)} of passes "
        f"{MIDDLE[0]}-{MIDDLE[1]}'s ({n_doc} held-out documents): it {verdict}"
    )
    return Verdict("fig3-run", verdict, text)


def every(n: int) -> str:
    """'every seed', or where one seed was studied 'the one seed studied': a verdict over seeds says how many it rests on."""
    return "every seed" if n > 1 else "the one seed studied"


def three_pass(by_seed: dict[int, tuple[Verdict, Verdict]]) -> Verdict:
    """{seed: (the 75/22/3 run's fig3-run verdict, the 75/25 run's)} -> the paper's 3 % claim over seeds."""
    n = len(by_seed)
    holds = [s for s, (a, b) in by_seed.items() if a.verdict.startswith("contracts") and b.verdict == "diverges"]
    per = "; ".join(f"seed {s}: 75/22/3 {a.verdict}, 75/25 {b.verdict}" for s, (a, b) in sorted(by_seed.items()))
    if n and len(holds) == n:
        verdict = f"replicates on {every(n)}"
        text = f"on every one of {n} seeds the 75/22/3 run contracts and the 75/25 run diverges ({per})"
    elif holds:
        verdict = f"replicates on {len(holds)} of {n} seeds"
        text = f"the 75/22/3 run contracts and the 75/25 run diverges on {len(holds)} of {n} seeds ({per})"
    else:
        verdict = "does not replicate on any seed"
        text = f"on no seed does the 75/22/3 run contract while the 75/25 run diverges ({per})"
    return Verdict("three-pass", verdict, "the 3 % of three-pass batches: " + text)


def fig4_seed(loss: np.ndarray, base_loss: np.ndarray | None = None) -> dict:
    """One seed's Fig. 4 numbers from the feedback model's `loss` [passes >= 5, documents] and the
    baseline's standard loss per document: the drop from 0 to 4 feedback passes, the first pass's
    drop minus that of passes 2-4, and the feedback model's standard loss minus the baseline's."""
    drop = _boot(loss[0] - loss[4])
    front = _boot((loss[0] - loss[1]) - (loss[1] - loss[4]))
    out = {"drop": drop, "front": front, "documents": loss.shape[1]}
    if base_loss is not None:
        out["vs_baseline"] = _boot(loss[0] - base_loss)
    return out


def fig4(by_seed: dict[int, dict]) -> Verdict:
    """{seed: fig4_seed(...)} -> does loss fall with prefill passes, and is the gain front-loaded."""
    n = len(by_seed)
    if n == 0 or any(v["documents"] < MIN_DOCUMENTS for v in by_seed.values()):
        return Verdict("fig4", "cannot say", f"Fig. 4: too few held-out documents (at least {MIN_DOCUMENTS})")
    falls = [s for s, v in by_seed.items() if v["drop"][1] > 0]
    rises = [s for s, v in by_seed.items() if v["drop"][2] < 0]
    front = [s for s, v in by_seed.items() if v["front"][1] > 0]
    back = [s for s, v in by_seed.items() if v["front"][2] < 0]
    per = "; ".join(
        f"seed {s}: loss at 0 passes minus at 4 {fmt(v['drop'], 3)}, the first pass's drop minus passes 2-4's "
        f"{fmt(v['front'], 3)}"
        for s, v in sorted(by_seed.items())
    )
    if len(falls) == n:
        shape = (
            f"front-loaded on {every(n)}"
            if len(front) == n
            else "not front-loaded on any seed"
            if len(back) == n
            else f"front-loaded on {len(front)} of {n} seeds"
        )
        verdict = f"falls with passes, {shape}"
    elif len(rises) == n:
        verdict = f"rises with passes on {every(n)}"
    elif not falls and not rises:
        verdict = "cannot say (no seed's interval excludes 0)"
    else:
        verdict = f"falls with passes on {len(falls)} of {n} seeds and rises on {len(rises)}"
    text = f"held-out loss from 0 to 4 feedback passes at prefill {verdict} (nats; {per})"
    return Verdict("fig4", verdict, text)


PAPER, TWO_PASS = "1:0.75,2:0.22,3:0.03", "1:0.75,2:0.25"
NAMES = {PAPER: "75/22/3", TWO_PASS: "75/25"}


def arrays(table, run: str, column: str) -> np.ndarray:
    """[passes, documents] of one run's `column` (documents in name order, the same for every run)."""
    t = table[table["run"] == run]
    return t.pivot(index="pass", columns="document", values=column).sort_index().to_numpy()


def passes_verdicts(table) -> list[Verdict]:
    """Every verdict a `diagnose passes` table supports: Fig. 3 per feedback run (with at least
    TAIL[1] passes), the 3 % claim over the seeds that have both schedules, and Fig. 4 over the seeds
    of the paper's schedule (against each seed's baseline where the table has it)."""
    runs = table.drop_duplicates("run")[["run", "schedule", "seed", "baseline"]]
    out, fig3_by = [], {}
    for r in runs.itertuples():
        if r.baseline or table.loc[table["run"] == r.run, "pass"].max() < TAIL[1]:
            continue
        label = f"{NAMES.get(r.schedule, r.schedule)}, seed {r.seed}"
        v = fig3_run(label, fig3_numbers(arrays(table, r.run, "loss"), arrays(table, r.run, "change")))
        out.append(v)
        fig3_by[(r.schedule, r.seed)] = v
    both = {
        s: (fig3_by[(PAPER, s)], fig3_by[(TWO_PASS, s)])
        for (sch, s) in fig3_by
        if sch == PAPER and (TWO_PASS, s) in fig3_by
    }
    if both:
        out.append(three_pass(both))
    seeds4 = {}
    for r in runs[(runs["schedule"] == PAPER) & ~runs["baseline"]].itertuples():
        base = runs[runs["baseline"] & (runs["seed"] == r.seed)]
        base_loss = arrays(table, base["run"].iloc[0], "loss")[0] if len(base) else None
        seeds4[int(r.seed)] = fig4_seed(arrays(table, r.run, "loss"), base_loss)
    if seeds4:
        out.append(fig4(seeds4))
    return out
