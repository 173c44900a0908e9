"""The findings' rules: each turns a small table into a verdict and its sentence, by a criterion
stated once here and printed in the report (`CRITERIA`). Nothing here reads files or runs a model;
the study's parts feed their tables in. Every rule can fail: its test (tests/test_rules.py) feeds it
a table that gives the verdict, one that gives the opposite, and one of noise around its threshold
or at the floor (0 of n, n of n, n <= 3 groups) that must give "cannot say".

Two conventions hold for every rule. **A floor on evidence**: a number resting on fewer than
`MIN_GROUPS` (8) groups is no evidence; a rule that reads one says "cannot say" (too few groups).
**The training seed is the unit**: a rule reads one seed's numbers, and `over_seeds` states a
verdict only where every seed's own numbers give it; otherwise it says on how many seeds it holds,
with each seed's numbers.

A number is a tuple (value, low, high) or (value, low, high, n groups); n None (or absent) is not
checked against the floor.

| rule          | what it reads (one seed's numbers)                               | verdicts                                        |
|---------------|------------------------------------------------------------------|-------------------------------------------------|
| trend         | per-length means and the slope's interval over groups            | rises / falls / cannot say                      |
| directions    | per swap direction, the share following the swapped-in state     | one direction / both / neither / partial / cannot say |
| redundancy    | answer accuracy with the gate bypassed and with the mean state   | redundant / needed / cannot say                 |
| recomputable  | each task's standard answer accuracy                             | recomputable / not-answered / not-recomputable / cannot say |
| readout       | depth-0 and carried-state probe accuracy per model               | readout / transformed / cannot say              |
| fig7a         | depth-0 `recurrent:1` accuracy and feedback − control (paired)   | replicates / does not replicate / cannot say    |
| fig7b         | probe accuracy over depths 1..L per mode, `full`'s answer        | replicates / does not replicate / untestable / cannot say |
| fig3          | the validation loss's rise from pass 1 to the last (documents)   | replicates / does not replicate / cannot say    |
| contraction   | the tail's state change over the early and the middle passes'    | contracts, still decaying / falls to a plateau / does not contract / cannot say |
| das           | DAS k = 1 IIA against the full swap's, on the model and control  | exceeds / within / cannot say                   |
| sae           | per k: label-latent and random-active shares of the swap         | sparse at k / not sparse / cannot say           |
| sae-grid      | the same per SAE of a grid                                       | sparse at k on all / m of N / not sparse / cannot say |
| paired        | feedback − baseline over shared groups (difference, CI, n)       | higher / lower / same / constant / cannot say / no gap |
| depth         | answer accuracy per model × k × mode (value, CI, groups)          | separates at k / does not separate / cannot say |
| depth-seeds   | the depth verdict of each training seed's table                  | on every seed / on m of n / on no seed / cannot say |
| probe-variants| the depth-0 reading's range over probe variants, both models     | depends on the probe / does not / cannot say    |
| seeds         | any rule's verdict on each training seed                         | the verdict on every seed / on m of n seeds     |
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fbt_probe.stats import MIN_GROUPS, group_wilson

CANNOT = "cannot say"
TREND_BOOT = 2000
FOLLOWS, IGNORES = 0.9, 0.1  # a swap direction follows at or above FOLLOWS, ignores at or below IGNORES
REDUNDANT = 0.9  # without the state's information the answer stays at or above this: the state is redundant
RECOMPUTABLE = 0.95  # standard prefill's accuracy at or above this on every task, each interval above chance
READOUT = 0.02  # depth 0 within this of the carried-state probe: a read-out of h(T-1)
SAME = 0.02  # feedback − control within ±SAME (its whole interval): the control reads the same
FIG7A_LOW = 0.9  # depth-0 `recurrent:1` accuracy's lower bound at or above this: decodable as in the paper
FIG7B_TIE = 0.02  # `full` within this of the best other mode over depths 1..L: at least as good
FLAT_LOSS = 0.1  # nats: the last pass's validation loss within this of pass 1's (the rise's interval)
DECAYED = 0.5  # the tail's state change below this share of the early passes' (upper end): it falls
PLATEAU = 0.5  # the tail's change below this share of the middle passes' (upper end): still decaying
DAS_MARGIN = 0.1  # DAS exceeds the full swap when its lower bound clears the swap's IIA by this
SAE_SHARE = 0.8  # k label latents carry at least this share of the full-state swap's effect (lower bound)
VARIANT_SPREAD = 0.02  # a reading that moves less than this over probe variants does not depend on the probe
CHANCE = 0.5
DEPTH_CHANCE = 0.65  # serial depth: `standard` (and the baseline, every mode) at or below this is "at chance"
DEPTH_SOLVED = 0.9  # a feedback mode at or above this (its Wilson interval above chance) "answers" k

CRITERIA = {
    "trend": (
        "a trend word (rises, falls) is used only when the slope of the per-length means against the "
        "length's rank has a group-bootstrap 95 % CI that excludes 0 and the means move the same way at "
        f"every step, on at least {MIN_GROUPS} groups; otherwise the values are listed"
    ),
    "directions": (
        f"the answer follows the swapped-in state in a direction when it does in at least {FOLLOWS:.0%} of that "
        f"direction's pairs with a Wilson interval above chance, ignores it at most {IGNORES:.0%} with the interval "
        f"below chance, and follows in part when the interval lies between {IGNORES} and {FOLLOWS}; otherwise, or "
        f"on fewer than {MIN_GROUPS} groups, the table cannot say"
    ),
    "redundancy": (
        "whether the carried state is needed is read from the runs without its information: the gate bypassed "
        "(the plain token input, no state) and the state replaced by its mean; setting the fused input to zero "
        "erases the token as well (the fused input replaces the token embedding), so it is quoted but not read. "
        f"The state is largely redundant when either run answers at {REDUNDANT} or above with a Wilson interval "
        f"above chance, and needed when every such run's interval lies below {REDUNDANT}"
    ),
    "recomputable": (
        f"a model can recompute the answer without the carried state when its standard-prefill answer "
        f"accuracy is at least {RECOMPUTABLE} on every task with a Wilson interval above chance, and cannot when "
        f"some task's interval lies below {RECOMPUTABLE}"
    ),
    "readout": (
        f"depth 0 under `recurrent:1` is a read-out of h(T-1) when its probe accuracy is within {READOUT} of "
        "the probe on the carried state itself, and differs from it when their Wilson intervals are apart"
    ),
    "fig7a": (
        f"Fig. 7a replicates when the depth-0 `recurrent:1` accuracy's lower bound is at least {FIG7A_LOW} and the "
        "paired feedback − untrained-fusion control difference there lies above 0; it does not when the accuracy's "
        f"upper end is below {FIG7A_LOW} or the difference lies within ±{SAME} (the control reads the same) or "
        "below 0 (standard prefill's depth 0 is chance by construction, every sample ending in the same token, so "
        "it is no contrast)"
    ),
    "fig7b": (
        f"Fig. 7b replicates when `full`'s probe accuracy averaged over depths 1..L is within {FIG7B_TIE} of the "
        "best other mode's or above, and does not when its Wilson interval lies below the best other mode's; it is "
        "untestable where the model does not answer the task under `full` (its answer accuracy's interval not "
        "above chance)"
    ),
    "fig3": (
        f"Fig. 3 replicates when the validation loss's rise from pass 1 to the last pass has its interval over "
        f"documents below {FLAT_LOSS} nats, and does not when the interval lies above it (paper: flat to 30 passes)"
    ),
    "contraction": (
        "the iteration's contraction is judged on the curve's tail (of N passes: early 2..N/8, middle "
        "N/4+1..N/2, tail 3N/4+1..N; 2-4, 9-16, 25-32 of 32), each a ratio of mean state changes over documents "
        f"with its bootstrap interval: the change falls when the tail is below {DECAYED} of the early passes' "
        f"(upper end), is still decaying when the tail is also below {PLATEAU} of the middle passes' (upper "
        f"end), and has reached a plateau when it is not (lower end at or above {PLATEAU}); the iteration does "
        f"not contract when the tail's ratio to the early passes has its lower end at or above {DECAYED}"
    ),
    "das": (
        f"DAS is said to exceed the full-vector swap when its k = 1 interchange accuracy's Wilson lower bound "
        f"clears the full swap's accuracy by {DAS_MARGIN}, and to stay within it when its upper end does not "
        "reach that margin; the untrained-fusion baseline, where the fusion carries no learned variable, is its "
        "control"
    ),
    "sae": (
        f"an SAE is said to carry the swap's effect in k latents when the top-k label latents carry at least "
        f"{SAE_SHARE} of the full-state swap's effect (the interval's lower end) and k random latents active in the "
        "same pairs carry less (their intervals apart); not at k when the label latents' interval lies below "
        f"{SAE_SHARE} or the random latents carry as much; k is quoted against the most latents a pair can have active"
    ),
    "sae-grid": (
        "the SAE claim is counted over a grid of TopK SAEs (SAE seeds × widths, and one trained on demo-sized "
        "data), each judged by the criterion above with its own label latents and random control; the sentence "
        "quotes the k at which it holds on the most SAEs (the smallest such k) and says on how many"
    ),
    "paired": (
        "a contrast between the two models is the paired difference feedback − baseline over the groups both "
        "share, with a percentile group bootstrap that draws those groups once for both models; the feedback "
        "model is said to read higher (lower) only when that interval lies above (below) 0, and a normalized "
        "effect is compared only where both models have the clean–corrupt gap"
    ),
    "depth": (
        f"the serial-depth task separates the modes at k when the feedback model's `standard` answer accuracy is at "
        f"most {DEPTH_CHANCE} there, a feedback mode's is at least {DEPTH_SOLVED} with its Wilson lower bound (n = "
        f"groups) above chance, and the no-feedback baseline's is at most {DEPTH_CHANCE} under every mode; not at k "
        f"when every feedback mode's interval lies below {DEPTH_SOLVED}, `standard`'s above {DEPTH_CHANCE} or the "
        f"baseline's above it under some mode; a k whose cells have fewer than {MIN_GROUPS} held-out groups is listed "
        f"as too few groups and read for nothing; `standard` is at chance from k = N on when it is at most "
        f"{DEPTH_CHANCE} at N and every larger k, a feedback mode answers up to k = M when M is the largest k where "
        f"it reaches {DEPTH_SOLVED} with its lower bound above chance"
    ),
    "depth-seeds": (
        "over training seeds, the serial-depth criterion is applied to each seed's own table, and the modes are "
        "said to separate only where they do on every seed"
    ),
    "probe-variants": (
        "a depth-0 reading depends on the probe when its range over probe variants (features standardised or "
        f"raw, C from 0.01 to 10) exceeds {VARIANT_SPREAD}, twice the other model's range, and the Wilson "
        "half-width at its n groups; it does not when the range is within both"
    ),
    "seeds": (
        "the training seed is the unit of a claim: each headline number is the mean over the training seeds "
        "of the seeds table with its between-seed t interval (this study's within-run interval beside it), and a "
        "verdict is stated only where each seed's own numbers give it; otherwise the sentence says on how many "
        f"seeds it holds and gives each seed's numbers. No verdict rests on a cell of fewer than {MIN_GROUPS} groups"
    ),
}


@dataclass(frozen=True)
class Verdict:
    rule: str
    verdict: str
    sentence: str
    short: str = ""  # the numbers behind the verdict, compactly (what `over_seeds` lists per seed)


def _num(t) -> tuple[float, float, float, int | None]:
    """(value, low, high, n) of a number given as a 3- or 4-tuple (n None: not checked)."""
    t = tuple(t)
    return (float(t[0]), float(t[1]), float(t[2]), None if len(t) < 4 or t[3] is None else int(t[3]))


def _few(*nums) -> int | None:
    """The smallest n below MIN_GROUPS among `nums`, else None."""
    ns = [_num(x)[3] for x in nums if x is not None]
    low = [n for n in ns if n is not None and n < MIN_GROUPS]
    return min(low) if low else None


def _too_few(n: int) -> str:
    return f"{n} group{'s' if n != 1 else ''}: too few groups (at least {MIN_GROUPS})"


def fmt(p, lo, hi) -> str:
    """'**0.91** [0.85, 0.95]' ('n/a' for a missing estimate). An interval that prints with zero width at
    two decimals is printed at three; one of zero width at three is not printed as an interval."""
    if p != p:
        return "n/a"
    if lo != lo or hi != hi:
        return f"**{p:.2f}** (no interval)"
    if f"{lo:.2f}" != f"{hi:.2f}":
        return f"**{p:.2f}** [{bound(lo)}, {bound(hi)}]"
    if f"{lo:.3f}" != f"{hi:.3f}":
        return f"**{p:.3f}** [{bound(lo, 3)}, {bound(hi, 3)}]"
    return f"**{p:.2f}** (no spread over groups)"


def bound(x: float, digits: int = 2) -> str:
    """An interval end as quoted: '-0.00' (a bound just below 0) written '0.00'."""
    s = f"{x:.{digits}f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s


def span(lo: float, hi: float, digits: int = 2) -> str:
    """An interval as quoted, '[0.10, 0.14]'; one that prints with zero width at `digits` is printed with
    one digit more, and one of zero width there too is said in words (never a zero-width interval)."""
    for d in (digits, digits + 1):
        a, b = bound(lo, d), bound(hi, d)
        if a != b:
            return f"[{a}, {b}]"
    return "(no spread over groups)"


def signed(x: float, digits: int = 2) -> str:
    """A difference as quoted: '+0.12', '-0.05', and '0.00' where it rounds to 0 (no '-0.00')."""
    s = f"{x:+.{digits}f}"
    return s[1:] if float(s) == 0 else s


def plain(t, digits: int = 2) -> str:
    """'0.91 [0.85, 0.95]' of a number (no bold), for the per-seed lists."""
    v, lo, hi, _ = _num(t)
    if v != v:
        return "n/a"
    if lo != lo:
        return f"{v:.{digits}f}"
    return f"{v:.{digits}f} {span(lo, hi, digits)}"


# ----------------------------------------------------------------------------- trend
def trend_slope_ci(per_pair: pd.DataFrame, n_boot: int = TREND_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(slope, low, high) of the per-length means against the length's rank (0, 1, 2, ...), with the
    percentile group bootstrap: groups resampled with replacement, each with its pairs at every length.
    With a column `den` the per-length statistic is a ratio of means, Σvalue / Σden (a normalized
    effect: `value` the pair's patched − corrupt, `den` its clean − corrupt)."""
    lengths = sorted(per_pair["length_knob"].unique())
    rank = {k: i for i, k in enumerate(lengths)}
    x = per_pair["length_knob"].map(rank).to_numpy()
    v = per_pair["value"].to_numpy(dtype=float)
    d = per_pair["den"].to_numpy(dtype=float) if "den" in per_pair.columns else np.ones_like(v)
    g_codes, g_index = pd.factorize(per_pair["group_id"])
    G, L = len(g_index), len(lengths)
    sums = np.zeros((G, L))
    counts = np.zeros((G, L))
    np.add.at(sums, (g_codes, x), v)
    np.add.at(counts, (g_codes, x), d)

    def slope(w):
        s, c = (w[:, None] * sums).sum(0), (w[:, None] * counts).sum(0)
        keep = c != 0
        if keep.sum() < 2:
            return np.nan
        return np.polyfit(np.arange(L)[keep], s[keep] / c[keep], 1)[0]

    theta = slope(np.ones(G))
    rng = np.random.default_rng(seed)
    boots = np.array([slope(np.bincount(rng.integers(0, G, G), minlength=G).astype(float)) for _ in range(n_boot)])
    boots = boots[~np.isnan(boots)]
    lo, hi = np.quantile(boots, [0.025, 0.975]) if len(boots) else (np.nan, np.nan)
    return float(theta), float(lo), float(hi)


def trend_numbers(per_pair: pd.DataFrame, n_boot: int = TREND_BOOT, seed: int = 0) -> dict:
    """One seed's trend numbers from its pairs: {"means": {length: mean (a ratio of means with `den`)},
    "slope": (slope, low, high) or None with one length, "groups": distinct groups}."""
    g = per_pair.groupby("length_knob")
    means = g["value"].sum() / (g["den"].sum() if "den" in per_pair.columns else g["value"].count())
    means = {int(k): float(m) for k, m in means.sort_index().items()}
    slope = trend_slope_ci(per_pair, n_boot, seed) if len(means) >= 2 else None
    return {"means": means, "slope": slope, "groups": int(per_pair["group_id"].nunique())}


def trend_verdict(what: str, numbers: dict) -> Verdict:
    """`what` (a value per length) rises / falls with length, or the table cannot say (CRITERIA["trend"]).
    `numbers`: `trend_numbers`' dict (slope None: no interval, as in a seeds table without the slope)."""
    means, slope, n = numbers["means"], numbers.get("slope"), numbers.get("groups")
    listed = ", ".join(f"{m:.2f}" for m in means.values()) + " at lengths " + ", ".join(map(str, means))
    short = " / ".join(f"{m:.2f}" for m in means.values())
    if len(means) < 2:
        return Verdict("trend", "single-length", f"{what} is measured at one length ({listed})", short)
    if n is not None and n < MIN_GROUPS:
        return Verdict("trend", CANNOT, f"{what}: {listed} ({_too_few(n)})", short)
    if slope is None or slope[1] != slope[1]:
        return Verdict("trend", CANNOT, f"{what}: {listed} (no slope interval)", short + ", no slope interval")
    s, lo, hi = slope
    slope_ci = f"slope per length step {s:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    short += f", slope {s:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    steps = np.sign(np.diff(list(means.values())))
    if lo > 0 and (steps > 0).all():
        return Verdict("trend", "rises", f"{what} rises with length: {listed} ({slope_ci})", short)
    if hi < 0 and (steps < 0).all():
        return Verdict("trend", "falls", f"{what} falls with length: {listed} ({slope_ci})", short)
    why = "the slope's interval holds 0" if lo <= 0 <= hi else "the means do not move the same way at every step"
    return Verdict("trend", CANNOT, f"{what}: no trend word, {listed} ({slope_ci}; {why})", short)


def trend(per_pair: pd.DataFrame, what: str, n_boot: int = TREND_BOOT, seed: int = 0) -> Verdict:
    """How `what` (a per-pair value) changes with length (`trend_verdict` of `trend_numbers`)."""
    return trend_verdict(what, trend_numbers(per_pair, n_boot, seed))


# ----------------------------------------------------------------------------- swap directions
def direction_rates(per_pair: pd.DataFrame) -> dict[int, tuple[float, float, float, int]]:
    """{receiving label: (share following, Wilson low, high, groups)} of per-pair follow values."""
    out = {}
    for label, g in per_pair.groupby("label"):
        n_g = int(g["group_id"].nunique())
        out[int(label)] = (*group_wilson(float(g["value"].mean()), n_g), n_g)
    return out


def directions_verdict(rates: dict, what: str = "the answer") -> Verdict:
    """rates: {receiving label: (share following, Wilson low, high, groups)} -> whether `what` follows
    the swapped-in state in one direction, both, neither, in part, or the table cannot say."""
    parts, kinds = [], {}
    for label, r in sorted(rates.items()):
        p, lo, hi, n = _num(r)
        parts.append(f"{fmt(p, lo, hi)} into label-{label} samples ({n} groups)")
        if n is not None and n < MIN_GROUPS:
            kinds[label] = "few"
        elif p >= FOLLOWS and lo > CHANCE:
            kinds[label] = "follows"
        elif p <= IGNORES and hi < CHANCE:
            kinds[label] = "ignores"
        elif IGNORES < lo and hi < FOLLOWS:
            kinds[label] = "part"
        else:
            kinds[label] = "unsure"
    text = f"{what} follows the swapped-in state at " + " and ".join(parts)
    short = " / ".join(f"label-{k} {_num(r)[0]:.2f}" for k, r in sorted(rates.items()))
    k = list(kinds.values())
    if not k or "few" in k or "unsure" in k:
        why = "too few groups" if "few" in k else "an interval reaches a threshold"
        return Verdict("directions", CANNOT, text + f" (cannot say in which direction it flips: {why})", short)
    if len(k) == 2 and sorted(k) == ["follows", "ignores"]:
        into = next(lab for lab, v in kinds.items() if v == "follows")
        return Verdict(
            "directions", "one direction", text + f": it flips in one direction only (into label-{into})", short
        )
    if all(v == "follows" for v in k):
        return Verdict("directions", "both", text + ": it flips in both directions", short)
    if all(v == "ignores" for v in k):
        return Verdict("directions", "neither", text + ": it flips in neither direction", short)
    return Verdict("directions", "partial", text + ": it follows in part", short)


def directions(per_pair: pd.DataFrame, what: str = "the answer") -> Verdict:
    """Whether `what` follows the swapped-in state in each swap direction (`label`: the receiving
    sample's label; `value`: 1 where it follows), Wilson intervals at n = groups."""
    return directions_verdict(direction_rates(per_pair), what)


# ----------------------------------------------------------------------------- is the state needed
def redundancy(
    task: str,
    bypass: tuple | None,
    mean: tuple | None,
    zero: tuple | None = None,
    swap_norm: float | None = None,
) -> Verdict:
    """Whether the carried state is needed (`CRITERIA["redundancy"]`), from answer accuracy (value, Wilson
    low, high, groups) with the gate bypassed (`bypass`: the plain token input, no state) and with the
    state replaced by its mean (`mean`). `zero` (the fused input set to zero, which erases the token as
    well) is quoted, never read for the verdict."""
    said = []
    if zero is not None:
        said.append(
            f"with the fused input set to zero (the token erased as well), {task} is answered at {fmt(*_num(zero)[:3])}"
        )
    runs = {"the gate bypassed (the plain token input, no state)": bypass, "the state replaced by its mean": mean}
    runs = {k: v for k, v in runs.items() if v is not None}
    said += [f"with {k} at {fmt(*_num(v)[:3])}" for k, v in runs.items()]
    text = "; ".join(said)
    short = ", ".join(f"{'bypass' if 'bypass' in k else 'mean state'} {_num(v)[0]:.2f}" for k, v in runs.items())
    if not runs:
        return Verdict("redundancy", CANNOT, text + ": no run without the state's information", short)
    few = _few(*runs.values())
    if few is not None:
        return Verdict("redundancy", CANNOT, text + f" ({_too_few(few)})", short)
    kept = [k for k, v in runs.items() if _num(v)[0] >= REDUNDANT and _num(v)[1] > CHANCE]
    if kept:
        extra = "" if swap_norm is None else f", although a swap moves it by a normalized {swap_norm:.2f}"
        return Verdict(
            "redundancy",
            "redundant",
            text + f": the state is largely redundant{extra} (the model reads it when it is there, but recovers the "
            "answer without its information)",
            short,
        )
    if all(_num(v)[2] < REDUNDANT for v in runs.values()):
        return Verdict(
            "redundancy", "needed", text + ": without the state's information the answer is lost in part", short
        )
    return Verdict("redundancy", CANNOT, text + ": the intervals cannot say whether the state is needed", short)


# ----------------------------------------------------------------------------- recomputable
def recomputable(model_label: str, accs: dict) -> Verdict:
    """accs: task -> (standard answer accuracy, Wilson low, high[, groups])."""
    nums = {t: _num(a) for t, a in accs.items()}
    short = ", ".join(f"{t} {v[0]:.2f}" for t, v in nums.items())
    few = _few(*accs.values())
    if not nums or few is not None:
        why = _too_few(few) if few is not None else "no task"
        return Verdict(
            "recomputable", CANNOT, f"{model_label}: cannot say whether it answers every task ({why})", short
        )
    fails = [t for t, (p, lo, hi, _) in nums.items() if hi < RECOMPUTABLE]
    chance = [t for t in fails if nums[t][1] <= CHANCE]
    if chance:
        return Verdict(
            "recomputable",
            "not-answered",
            f"{model_label} does not answer {', '.join(chance)} above chance under standard prefill: the probes and "
            "causal tests there read a model that has not learned the task",
            short,
        )
    if fails:
        return Verdict(
            "recomputable",
            "not-recomputable",
            f"{model_label} answers {', '.join(fails)} above chance but below {RECOMPUTABLE} under standard prefill: "
            "there the carried state may be needed",
            short,
        )
    if all(p >= RECOMPUTABLE and lo > CHANCE for p, lo, _, _ in nums.values()):
        low = min(p for p, _, _, _ in nums.values())
        return Verdict(
            "recomputable",
            "recomputable",
            f"{model_label} answers every task under standard prefill (lowest accuracy {low:.2f}): the answer can "
            "always be recomputed without the carried state, so an effect of the state shows that the model reads "
            "it when it is there, not that the task needs it",
            short,
        )
    return Verdict(
        "recomputable",
        CANNOT,
        f"{model_label}: an interval reaches {RECOMPUTABLE}, so the table cannot say whether every task is "
        "answered without the carried state",
        short,
    )


# ----------------------------------------------------------------------------- read-out of h(T-1)
def readout(task: str, pairs: dict) -> Verdict:
    """pairs: model -> (depth-0 `recurrent:1` probe accuracy, carried-state probe accuracy), each a
    number (value, low, high[, groups]) or a bare value (no interval: only the read-out can be said)."""
    nums = {
        m: tuple(x if isinstance(x, tuple) else (x, float("nan"), float("nan")) for x in pc) for m, pc in pairs.items()
    }
    said = "; ".join(
        f"{m} {_num(d)[0]:.3f} at depth 0 vs {_num(c)[0]:.3f} on the carried state" for m, (d, c) in nums.items()
    )
    short = "; ".join(f"{m} {_num(d)[0]:.3f} vs {_num(c)[0]:.3f}" for m, (d, c) in nums.items())
    few = _few(*(x for pc in nums.values() for x in pc))
    if not nums or few is not None:
        why = _too_few(few) if few is not None else "no model"
        return Verdict("readout", CANNOT, f"On {task}, depth 0 under `recurrent:1` ({said}; {why})", short)
    if all(abs(_num(d)[0] - _num(c)[0]) <= READOUT for d, c in nums.values()):
        return Verdict(
            "readout",
            "readout",
            f"On {task}, depth 0 under `recurrent:1` reads what h(T-1) holds ({said}): the feedback − baseline gap "
            "there compares the two networks' top states, not a learned fusion",
            short,
        )
    apart = [m for m, (d, c) in nums.items() if _num(d)[1] > _num(c)[2] or _num(d)[2] < _num(c)[1]]
    if apart:
        return Verdict(
            "readout",
            "transformed",
            f"On {task}, depth 0 under `recurrent:1` differs from h(T-1) ({said}; intervals apart on {', '.join(apart)})",
            short,
        )
    return Verdict(
        "readout",
        CANNOT,
        f"On {task}, depth 0 under `recurrent:1` ({said}): more than {READOUT} apart with intervals that overlap, "
        "so the table cannot say whether it is a read-out of h(T-1)",
        short,
    )


# ----------------------------------------------------------------------------- replication
def fig7a(task: str, rec: tuple, gap: tuple | None, paper: float | None = None) -> Verdict:
    """rec: depth-0 `recurrent:1` probe accuracy (value, Wilson low, high, groups); gap: the paired
    feedback − untrained-fusion control difference there (difference, low, high, shared groups) or None
    (no control: nothing to contrast). Standard prefill's depth 0 is chance by construction (every
    sample ends in the same token), so it is never the contrast."""
    p, lo, hi, _ = _num(rec)
    ref = f" (paper: {paper:.3f})" if paper else ""
    head = f"Fig. 7a on {task}: depth 0 reads {fmt(p, lo, hi)} under `recurrent:1`{ref}"
    short = f"{p:.2f}"
    if gap is None or gap[0] != gap[0]:
        return Verdict("fig7a", CANNOT, head + ", with no untrained-fusion control to contrast it with", short)
    d, dlo, dhi, n = _num(gap)
    short += f", feedback − control {signed(d)} {span(dlo, dhi)}"
    text = (
        head + f" and the untrained-fusion control's reading differs by feedback − baseline **{signed(d)}** "
        f"{span(dlo, dhi)} (paired, n = {n} groups)"
    )
    few = _few(rec, gap)
    if few is not None:
        return Verdict("fig7a", CANNOT, text + f" ({_too_few(few)})", short)
    if lo >= FIG7A_LOW and dlo > 0:
        return Verdict("fig7a", "replicates", text + ": the pattern replicates, above the control", short)
    if hi < FIG7A_LOW:
        return Verdict("fig7a", "does not replicate", text + f": it does not replicate (below {FIG7A_LOW})", short)
    if -SAME <= dlo and dhi <= SAME:
        return Verdict(
            "fig7a",
            "does not replicate",
            text + ": the control reads the same, so the decodability does not show a learned feedback (no "
            "replication as a contrast)",
            short,
        )
    if dhi < 0:
        return Verdict("fig7a", "does not replicate", text + ": the control reads higher (no replication)", short)
    return Verdict("fig7a", CANNOT, text + ": the intervals cannot say whether it replicates", short)


def fig7b(task: str, by_mode: dict, full_answer: tuple | None) -> Verdict:
    """by_mode: mode -> probe accuracy averaged over depths 1..L (value, Wilson low, high, groups at
    the mean), a table the report shows; full_answer: answer accuracy under `full` (value, low, high[,
    groups]) or None (not measured)."""
    nums = {m: _num(v if isinstance(v, tuple) else (v, float("nan"), float("nan"))) for m, v in by_mode.items()}
    listed = ", ".join(f"`{m}` {plain(v)}" for m, v in nums.items())
    short = ", ".join(f"{m} {v[0]:.2f}" for m, v in nums.items())
    head = f"Fig. 7b on {task}: probe accuracy averaged over depths 1..L is {listed} (paper: `full` best at depth)"
    if "full" not in nums:
        return Verdict("fig7b", "not-run", f"Fig. 7b on {task}: `full` was not probed ({listed})", short)
    if full_answer is not None:
        a = _num(full_answer)
        head += f"; under `full` the model answers at {fmt(*a[:3])}"
        if a[1] <= CHANCE:
            return Verdict(
                "fig7b",
                "untestable",
                head + ": untestable, for `full`'s probes describe a regime in which the model does not answer "
                "the task",
                short,
            )
    few = _few(*nums.values())
    if few is not None:
        return Verdict("fig7b", CANNOT, head + f" ({_too_few(few)})", short)
    others = {m: v for m, v in nums.items() if m != "full"}
    if not others:
        return Verdict("fig7b", CANNOT, head + ": no other mode to compare with", short)
    best_mode = max(others, key=lambda m: others[m][0])
    best, full = others[best_mode], nums["full"]
    if full[0] >= best[0] - FIG7B_TIE:
        return Verdict(
            "fig7b", "replicates", head + f": it replicates (`full` at or within {FIG7B_TIE} of the best)", short
        )
    if full[2] < best[1]:
        return Verdict(
            "fig7b", "does not replicate", head + f": it does not replicate (`full` below `{best_mode}`)", short
        )
    return Verdict("fig7b", CANNOT, head + ": the intervals cannot say whether `full` reads as well", short)


def fig3(rise: tuple, documents: int | None, shown: str = "") -> Verdict:
    """rise: the validation loss after the last pass minus after pass 1 (value, low, high) over
    `documents`; `shown`: the loss at a few passes, quoted."""
    v, lo, hi, _ = _num(rise)
    text = f"the validation loss rises by {plain(rise, 3)} nats from pass 1 to the last" + (
        f" ({shown})" if shown else ""
    )
    short = f"rise {plain(rise, 3)}"
    if documents is not None and documents < MIN_GROUPS:
        return Verdict("fig3", CANNOT, f"Fig. 3: {text} ({documents} documents: too few)", short)
    if hi < FLAT_LOSS:
        return Verdict("fig3", "replicates", f"Fig. 3 replicates: {text} (paper: flat to 30 passes)", short)
    if lo > FLAT_LOSS:
        return Verdict(
            "fig3", "does not replicate", f"Fig. 3 does not replicate: {text} (paper: flat to 30 passes)", short
        )
    return Verdict(
        "fig3", CANNOT, f"Fig. 3: {text}, an interval that holds {FLAT_LOSS} (paper: flat to 30 passes)", short
    )


# ----------------------------------------------------------------------------- contraction
def contraction_windows(passes: int) -> dict[str, tuple[int, int]]:
    """The passes (1-based, inclusive) whose mean state change the rule compares, for a curve of
    `passes`: early 2..max(2, N/8), middle N/4+1..N/2, tail 3N/4+1..N (32 passes: 2-4, 9-16, 25-32, as
    the general LM's Fig. 3)."""
    n = int(passes)
    return {"early": (2, max(2, n // 8)), "middle": (n // 4 + 1, max(n // 4 + 1, n // 2)), "tail": (3 * n // 4 + 1, n)}


def contraction(decay: tuple, level: tuple, documents: int | None, windows: dict, shown: str = "") -> Verdict:
    """decay: the tail's mean state change over the early passes' (ratio, low, high); level: the tail's
    over the middle passes'; each a ratio of means over `documents`; windows: `contraction_windows`."""
    e, m, t = windows["early"], windows["middle"], windows["tail"]
    span = lambda w: f"{w[0]}-{w[1]}" if w[0] != w[1] else f"{w[0]}"  # noqa: E731
    text = (
        (f"the carried state's change {shown}; " if shown else "")
        + f"over passes {span(t)} it is {plain(decay, 2)} of passes {span(e)}'s and {plain(level, 2)} of passes "
        f"{span(m)}'s" + (f" ({documents} documents)" if documents is not None else "")
    )
    short = f"tail/early {plain(decay)}, tail/middle {plain(level)}"
    if documents is not None and documents < MIN_GROUPS:
        return Verdict("contraction", CANNOT, text + f": too few documents (at least {MIN_GROUPS})", short)
    d, l_ = _num(decay), _num(level)
    if d[0] != d[0] or d[1] != d[1]:
        return Verdict("contraction", CANNOT, text + ": no interval", short)
    if d[1] >= DECAYED:
        verdict = "does not contract"
    elif d[2] < DECAYED:
        if l_[2] < PLATEAU:
            verdict = "contracts, still decaying"
        elif l_[1] >= PLATEAU:
            verdict = "falls to a plateau"
        else:
            verdict = CANNOT
    else:
        verdict = CANNOT
    said = {
        "does not contract": ": the iteration does not contract",
        "contracts, still decaying": ": the iteration contracts, still decaying at the last pass",
        "falls to a plateau": ": the change falls and then holds (a plateau: the iteration does not converge)",
        CANNOT: ": the intervals cannot say whether the iteration contracts",
    }[verdict]
    return Verdict("contraction", verdict, text + said, short)


# ----------------------------------------------------------------------------- DAS illusion control
def _das_kind(das: tuple, full: float) -> str:
    p, lo, hi, n = _num(das)
    if n is not None and n < MIN_GROUPS:
        return "few"
    if lo > full + DAS_MARGIN:
        return "exceeds"
    if hi <= full + DAS_MARGIN:
        return "within"
    return CANNOT


def das_illusion(task: str, das: tuple, full_swap: float, control: tuple | None = None) -> Verdict:
    """das: (DAS k = 1 IIA, Wilson low, high[, groups]) on the model; full_swap: the full-vector
    interchange's IIA; control: (the same DAS number, full swap's IIA) on the untrained-fusion baseline."""
    text = f"On {task}, DAS with k = 1 reaches an IIA of {fmt(*_num(das)[:3])} against the full-vector swap's {full_swap:.2f}"
    kind = _das_kind(das, full_swap)
    ctrl = ""
    if control is not None:
        c, cfull = control
        ck = _das_kind(c, cfull)
        ctrl = (
            f"; on the untrained-fusion baseline, whose fusion carries no learned variable, DAS reads "
            f"{fmt(*_num(c)[:3])} against its full swap's {cfull:.2f}"
        )
        ctrl += {
            "exceeds": " (the control shows the same excess, so the subspace need not be what the model uses)",
            "within": " (the control shows no such excess)",
        }.get(ck, "")
    short = f"DAS {plain(das)} vs full swap {full_swap:.2f}"
    if kind == "few":
        return Verdict("das", CANNOT, text + f" ({_too_few(_num(das)[3])})" + ctrl, short)
    if kind == "exceeds":
        return Verdict(
            "das",
            "exceeds",
            text + f": a one-dimensional subspace moves the answer more than the whole vector (by more than "
            f"{DAS_MARGIN}), the pattern of the interpretability illusion (a subspace that activates a pathway the "
            "model does not use)" + ctrl,
            short,
        )
    if kind == "within":
        return Verdict("das", "within", text + f": no more than the whole vector (by {DAS_MARGIN})" + ctrl, short)
    return Verdict("das", CANNOT, text + ": an interval that cannot say whether it exceeds the swap" + ctrl, short)


# ----------------------------------------------------------------------------- SAE sparsity
def _sae_split(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    feats = table[table["condition"] == "features"].set_index("k").sort_index()
    rand = table[table["condition"] == "random"].set_index("k")
    return feats, rand


def _sae_at(feats: pd.DataFrame, rand: pd.DataFrame, k) -> str:
    """The `sae` criterion at k: "holds", "fails" or "unsure" (a k without the control is judged on the
    label latents alone; fewer than MIN_GROUPS groups: "unsure")."""
    r = feats.loc[k]
    groups = r.get("groups")
    if groups is not None and groups == groups and int(groups) < MIN_GROUPS:
        return "unsure"
    has_rand = k in rand.index
    if r["ci_low"] >= SAE_SHARE and not (has_rand and rand.loc[k, "ci_high"] >= r["ci_low"]):
        return "holds"
    if r["ci_high"] < SAE_SHARE or (has_rand and rand.loc[k, "fraction"] >= r["fraction"]):
        return "fails"
    return "unsure"


def sae_sparsity(task: str, table: pd.DataFrame, max_active: int | None) -> Verdict:
    """table: rows of one task with columns condition ("features": the top-k label latents, "random": k
    random active latents), k, fraction, ci_low, ci_high (shares of the full-state swap's effect) and,
    optionally, groups."""
    feats, rand = _sae_split(table)
    of = "" if max_active is None else f" of at most {max_active} active latents"
    at = {k: _sae_at(feats, rand, k) for k in feats.index}
    for k, r in feats.iterrows():
        if at[k] != "holds":
            continue
        ctrl = (
            f", against {fmt(rand.loc[k, 'fraction'], rand.loc[k, 'ci_low'], rand.loc[k, 'ci_high'])} for {k} random "
            "active latents"
            if k in rand.index
            else " (no random-latent control at this k)"
        )
        return Verdict(
            "sae",
            f"sparse at {k}",
            f"{task}: {k} label latent{'s' if k > 1 else ''}{of} carry "
            f"{fmt(r['fraction'], r['ci_low'], r['ci_high'])} of the full-state swap's effect{ctrl}",
            f"sparse at {k}",
        )
    shown = []
    for k, r in feats.iterrows():
        c = f"{r['fraction']:.2f}"
        if k in rand.index:
            c += f" vs random {rand.loc[k, 'fraction']:.2f}"
        shown.append(f"k = {k}: {c}")
    listed = "; ".join(shown) + ("" if max_active is None else f"; a pair has at most {max_active} active latents")
    if at and all(v == "fails" for v in at.values()):
        return Verdict(
            "sae",
            "not sparse",
            f"{task}: not sparse — no k where the label latents carry {SAE_SHARE} of the swap's effect and k random "
            f"active latents carry less ({listed})",
            "not sparse",
        )
    return Verdict("sae", CANNOT, f"{task}: the intervals cannot say at which k the SAE is sparse ({listed})", CANNOT)


def _span(values, digits: int = 2) -> str:
    """'0.80–0.97' (one value if both ends print alike)."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo}–{hi}"


def _count(n: int, of: int) -> str:
    if of == 1:
        return "on the one SAE"
    return f"on all {of} SAEs" if n == of else f"on {n} of {of} SAEs"


def sae_sparsity_grid(task: str, table: pd.DataFrame) -> Verdict:
    """table: one task's rows over a grid of SAEs, columns sae (the first listed is quoted), condition
    ("features", "random"; others ignored), k, fraction, ci_low, ci_high, max_active (and, optionally,
    groups). Each SAE is judged by `sae_sparsity`'s criterion at each k; the sentence names the k at
    which the claim holds on the most SAEs (the smallest such k), quotes the first SAE for which it
    holds there, and gives the range of both shares at that k over every SAE; with no such k, 'not
    sparse' where every SAE fails at every k, else 'cannot say'."""
    table = table[table["condition"].isin(["features", "random"])]
    saes = list(dict.fromkeys(table["sae"]))
    n = len(saes)
    split = {s: _sae_split(table[table["sae"] == s]) for s in saes}
    most = {s: int(table.loc[table["sae"] == s, "max_active"].iloc[0]) for s in saes}
    ks = sorted({int(k) for f, _ in split.values() for k in f.index})
    state = {(s, k): _sae_at(*split[s], k) for s in saes for k in ks if k in split[s][0].index}
    holds = {k: [s for s in saes if state.get((s, k)) == "holds"] for k in ks}
    best = max(ks, key=lambda k: (len(holds[k]), -k)) if ks else None
    smallest = {s: next((k for k in ks if s in holds[k]), None) for s in saes}

    def at(k, cond: int) -> list[float]:
        """The share at k over every SAE that has it (cond 0: label latents, 1: random active)."""
        return [float(split[s][cond].loc[k, "fraction"]) for s in saes if k in split[s][cond].index]

    if best is None or not holds[best]:
        f0, r0 = split[saes[0]]
        shown = next((k for k in f0.index if f0.loc[k, "fraction"] >= SAE_SHARE), f0.index.max() if len(f0) else None)
        if shown is None:
            return Verdict("sae-grid", CANNOT, f"{task}: no feature swap on any SAE", CANNOT)
        rnd = f" vs random-{shown} {r0.loc[shown, 'fraction']:.2f}" if shown in r0.index else ""
        over = f"; over the {n} SAEs top-{shown} {_span(at(shown, 0))}"
        if at(shown, 1):
            over += f", random-{shown} {_span(at(shown, 1))}"
        numbers = (
            f"({saes[0]}: top-{shown} {f0.loc[shown, 'fraction']:.2f}{rnd}{over if n > 1 else ''}; a pair has at most "
            f"{_span(most.values(), 0)} active latents)"
        )
        where = "on any of the " + str(n) + " SAEs" if n > 1 else "on the one SAE"
        if state and all(v == "fails" for v in state.values()):
            return Verdict(
                "sae-grid",
                "not sparse",
                f"{task}: not sparse {where} — no k where the label latents carry {SAE_SHARE} of the full-state swap's "
                f"effect and as many random active latents carry less {numbers}",
                "not sparse",
            )
        return Verdict(
            "sae-grid",
            CANNOT,
            f"{task}: sparse at no k {where} by the criterion, and the intervals cannot say that it is not {numbers}",
            CANNOT,
        )
    k = best
    quoted = holds[k][0]
    f, r = split[quoted]
    ctrl = (
        f", {k} random active latent{'s' if k > 1 else ''} "
        f"{fmt(r.loc[k, 'fraction'], r.loc[k, 'ci_low'], r.loc[k, 'ci_high'])}"
        if k in r.index
        else ", no random-latent control at this k"
    )
    quote = f"{quoted}: {fmt(f.loc[k, 'fraction'], f.loc[k, 'ci_low'], f.loc[k, 'ci_high'])}{ctrl}"
    if n > 1:
        quote += f"; over the {n} SAEs {_span(at(k, 0))}"
        if at(k, 1):
            quote += f" against {_span(at(k, 1))}"
    text = (
        f"{task}: {_count(len(holds[k]), n)}, {k} label latent{'s' if k > 1 else ''} of at most {most[quoted]} "
        f"active carry most of the full-state swap's effect ({quote})"
    )
    verdict = f"sparse at {k} on all SAEs" if len(holds[k]) == n else f"sparse at {k} on {len(holds[k])} of {n} SAEs"
    if n > 1:
        fewer = [f"at k = {j} on {len(holds[j])} of {n}" for j in ks if j < k and holds[j]]
        if fewer:
            text += "; with fewer latents " + ", ".join(fewer)
        missed = [s for s in saes if s not in holds[k]]
        if missed:
            text += "; not on " + ", ".join(
                s + (" (at no k)" if smallest[s] is None else f" (there first at k = {smallest[s]})") for s in missed
            )
    return Verdict("sae-grid", verdict, text, verdict)


# ----------------------------------------------------------------------------- feedback - baseline
def paired(what: str, diff: tuple | None, gap: str = "") -> Verdict:
    """diff: (feedback − baseline, low, high, shared groups) from the `paired` table (`stats.paired_difference`).
    A zero-width interval means every resample gave the same difference (the models differ by the same
    amount in every shared group); it is said in words, not printed as an interval. A NaN difference
    over shared groups is a normalized effect one model has no gap for (`gap` names which)."""
    if diff is None or diff[3] == 0:
        return Verdict("paired", "not-paired", f"{what}: no group was measured on both models")
    d, lo, hi, n = diff
    groups = f"{n} group{'s' if n != 1 else ''}"
    if d != d:
        return Verdict(
            "paired",
            "no gap",
            f"{what}: not compared ({gap or 'no gap'}: a normalized effect needs the clean–corrupt gap on both models)",
            "no gap",
        )
    short = f"{signed(d)} {span(lo, hi)}"
    if n < MIN_GROUPS:
        return Verdict(
            "paired", CANNOT, f"{what}: feedback − baseline {signed(d)} over {groups} ({_too_few(n)})", short
        )
    if lo == hi:
        if d == 0:
            return Verdict(
                "paired",
                "same",
                f"{what}: feedback − baseline **0.00** in every one of the {groups} both models share (paired: the "
                "two models read the same in each, so this contrast has no power)",
                "0.00 in every group",
            )
        return Verdict(
            "paired",
            "constant",
            f"{what}: feedback − baseline **{signed(d)}** in every one of the {groups} both models share (paired: no "
            "spread between groups to resample)",
            f"{signed(d)} in every group",
        )
    shown = f"{what}: feedback − baseline **{signed(d)}** {span(lo, hi)} (paired, n = {groups})"
    if lo > 0:
        return Verdict("paired", "higher", shown, short)
    if hi < 0:
        return Verdict("paired", "lower", shown, short)
    return Verdict("paired", CANNOT, shown + ", an interval that holds 0", short)


# ----------------------------------------------------------------------------- serial depth
def _solves(r) -> bool:
    return r["value"] >= DEPTH_SOLVED and r["ci_low"] > CHANCE


def _enough(r) -> bool:
    g = r.get("groups") if hasattr(r, "get") else None
    return g is None or g != g or int(g) >= MIN_GROUPS


def depth_separation(table: pd.DataFrame, task: str = "compose-s3") -> Verdict:
    """table: answer accuracy per model ("feedback", "baseline") × k × mode, columns model, k, mode and
    the value with its Wilson interval (`accuracy` or `value`, ci_low, ci_high), and optionally
    `groups`. A k whose cells have fewer than MIN_GROUPS groups is too few groups and read for
    nothing. Separates at k when the feedback model's `standard` is at most DEPTH_CHANCE, one of its
    feedback modes at least DEPTH_SOLVED with its lower bound above chance, and the baseline at most
    DEPTH_CHANCE under every mode; does not separate at k when every feedback mode's interval lies below
    DEPTH_SOLVED, `standard`'s lies above DEPTH_CHANCE or the baseline's does under some mode
    (`CRITERIA["depth"]`)."""
    t = table.rename(columns={"accuracy": "value"}) if "value" not in table.columns else table
    few_ks = sorted({int(k) for k in t.loc[~t.apply(_enough, axis=1), "k"]}) if len(t) else []
    t = t[~t["k"].isin(few_ks)]
    fb = t[t["model"] == "feedback"]
    base = t[t["model"] == "baseline"]
    ks = sorted(int(k) for k in fb["k"].unique())
    feeding = [m for m in dict.fromkeys(fb["mode"]) if m != "standard"]
    few_note = (
        f"; k = {', '.join(map(str, few_ks))}: too few groups (fewer than {MIN_GROUPS} held-out groups), read for nothing"
        if few_ks
        else ""
    )

    def cell(model_rows, k, mode):
        r = model_rows[(model_rows["k"] == k) & (model_rows["mode"] == mode)]
        return None if r.empty else r.iloc[0]

    def said(r) -> str:
        return fmt(r["value"], r["ci_low"], r["ci_high"])

    std = {k: cell(fb, k, "standard") for k in ks}
    separated, failed = [], []
    for k in ks:
        s = std[k]
        cells = [c for m in feeding if (c := cell(fb, k, m)) is not None]
        solved = [m for m in feeding if (c := cell(fb, k, m)) is not None and _solves(c)]
        b = base[base["k"] == k]
        base_ok = not b.empty and bool((b["value"] <= DEPTH_CHANCE).all())
        if s is not None and s["value"] <= DEPTH_CHANCE and solved and base_ok:
            separated.append((k, solved))
        elif (
            (cells and all(c["ci_high"] < DEPTH_SOLVED for c in cells))
            or (s is not None and s["ci_low"] > DEPTH_CHANCE)
            or (not b.empty and bool((b["ci_low"] > DEPTH_CHANCE).any()))
        ):
            failed.append(k)
    short = ", ".join(
        f"k = {k} best {max((c['value'] for m in feeding if (c := cell(fb, k, m)) is not None), default=float('nan')):.2f}"
        for k in ks
    )
    if not separated:
        per_k = []
        for k in ks:
            rows = fb[(fb["k"] == k) & (fb["mode"] != "standard")]
            text = f"k = {k}:"
            if len(rows):
                best = rows.loc[rows["value"].idxmax()]
                text += f" best feedback mode `{best['mode']}` {said(best)}"
            if std[k] is not None:
                text += f", `standard` {said(std[k])}"
            b = base[base["k"] == k]
            if len(b):
                top = b.loc[b["value"].idxmax()]
                text += f", the baseline's best {said(top)} (`{top['mode']}`)"
            per_k.append(text)
        cells = " (best cells: " + "; ".join(per_k) + few_note + ")" if per_k else f" ({few_note[2:]})"
        if ks and len(failed) == len(ks):
            return Verdict(
                "depth",
                "does not separate",
                f"no knob value separates the modes on {task}: at no k is the feedback model's `standard` at or below "
                f"{DEPTH_CHANCE} while a feedback mode reaches {DEPTH_SOLVED} (its interval above chance) and the "
                f"baseline stays at or below {DEPTH_CHANCE} under every mode" + cells,
                short,
            )
        unsure = [k for k in ks if k not in failed]
        why = (
            f"at k = {', '.join(map(str, unsure))} the intervals cannot say"
            if unsure
            else f"no k has {MIN_GROUPS} held-out groups"
        )
        return Verdict(
            "depth", CANNOT, f"on {task} the table cannot say whether the modes separate ({why})" + cells, short
        )
    chance_from = None
    for k in reversed(ks):
        if std[k] is None or std[k]["value"] > DEPTH_CHANCE:
            break
        chance_from = k
    lead = (
        f"standard prefill answers at chance (at or below {DEPTH_CHANCE}) from k = {chance_from} on"
        if chance_from is not None
        else f"standard prefill is above {DEPTH_CHANCE} at the largest k"
    )
    answers = []
    for m in feeding:
        up = [k for k in ks if (c := cell(fb, k, m)) is not None and _solves(c)]
        answers.append(f"`{m}` up to k = {max(up)}" if up else f"`{m}` at no k")
    shown = []
    for k, solved in separated:
        best = max((cell(fb, k, m) for m in solved), key=lambda r: r["value"])
        shown.append(f"at k = {k}, `standard` {said(std[k])} against `{best['mode']}` {said(best)}")
    where = ", ".join(str(k) for k, _ in separated)
    return Verdict(
        "depth",
        f"separates at k = {where}",
        f"on {task} the feedback model's {lead}, while it answers (at {DEPTH_SOLVED} or above) with "
        + ", ".join(answers)
        + f", and the no-feedback baseline stays at or below {DEPTH_CHANCE} under every mode there: the modes "
        f"separate at k = {where} (" + "; ".join(shown) + few_note + ")",
        f"separates at k = {where}",
    )


def depth_over_seeds(verdicts: dict[int, Verdict]) -> Verdict:
    """`depth_separation`'s verdict on each training seed's table (seed -> verdict): the prediction of
    a positive control holds only where the modes separate on every seed (`CRITERIA["depth-seeds"]`)."""
    seeds = sorted(verdicts)
    sep = [s for s in seeds if verdicts[s].verdict.startswith("separates")]
    unsure = [s for s in seeds if verdicts[s].verdict == CANNOT]
    n = len(seeds)
    named = ", ".join(map(str, seeds))
    if not sep and not unsure:
        return Verdict(
            "depth-seeds", "on no seed", f"no knob value separates the modes on any of the {n} training seeds ({named})"
        )
    if not sep:
        return Verdict(
            "depth-seeds",
            CANNOT,
            f"the modes separate on none of the {n} training seeds, and on seed{'s' if len(unsure) > 1 else ''} "
            f"{', '.join(map(str, unsure))} the intervals cannot say that they do not",
        )
    where = "; ".join(f"seed {s}: {verdicts[s].verdict}" for s in sep)
    if len(sep) == n:
        return Verdict("depth-seeds", "on every seed", f"the modes separate on all {n} training seeds ({where})")
    rest = ", ".join(str(s) for s in seeds if s not in sep)
    return Verdict(
        "depth-seeds",
        f"on {len(sep)} of {n} seeds",
        f"the modes separate on {len(sep)} of the {n} training seeds ({where}), not on seed{'s' if n - len(sep) > 1 else ''} "
        f"{rest}: not a separation that holds on every seed",
    )


# ----------------------------------------------------------------------------- probe variants
def probe_dependence(baseline: tuple, feedback: tuple, n_groups: int | None) -> Verdict:
    """baseline, feedback: (lowest, highest) depth-0 reading over the probe variants of each model;
    n_groups: the groups the readings pool (the Wilson half-width at the control's mid-range is the
    sampling noise a spread must exceed)."""
    b, f = baseline[1] - baseline[0], feedback[1] - feedback[0]
    text = (
        f"Across probe variants (standardised or raw features, C from 0.01 to 10) the baseline reads "
        f"{baseline[0]:.2f}–{baseline[1]:.2f} and the feedback model {feedback[0]:.2f}–{feedback[1]:.2f}"
    )
    short = f"baseline {baseline[0]:.2f}–{baseline[1]:.2f}, feedback {feedback[0]:.2f}–{feedback[1]:.2f}"
    if n_groups is not None and n_groups < MIN_GROUPS:
        return Verdict("probe-variants", CANNOT, text + f" ({_too_few(n_groups)})", short)
    mid = (baseline[0] + baseline[1]) / 2
    _, lo, hi = group_wilson(mid, n_groups) if n_groups else (mid, mid, mid)
    noise = (hi - lo) / 2
    bar = max(VARIANT_SPREAD, 2 * f)
    if b > bar and b > noise:
        return Verdict(
            "probe-variants",
            "depends",
            text + ": the control's reading depends on the probe more than the feedback model's",
            short,
        )
    if b <= bar:
        return Verdict("probe-variants", "does not depend", text, short)
    return Verdict(
        "probe-variants",
        CANNOT,
        text + f" (a spread within the sampling noise of {n_groups} groups, ±{noise:.2f}: cannot say whether the "
        "reading depends on the probe)",
        short,
    )


# ----------------------------------------------------------------------------- over training seeds
def over_seeds(verdicts: dict[int, Verdict | None]) -> Verdict:
    """One rule's verdict on each training seed (seed -> its Verdict from that seed's own numbers; None:
    the seed lacks the numbers) as one verdict: "<v> on every seed" where every seed gives v, else
    "<v> on m of n seeds" for each verdict seen (n counts the seeds lacking the numbers too, so a
    seed without them is never read as agreeing), the sentence giving each seed's verdict and numbers
    (`Verdict.short`). With one seed the verdict is that seed's, said to be one seed's."""
    got = {s: v for s, v in sorted(verdicts.items()) if v is not None}
    missing = [s for s, v in sorted(verdicts.items()) if v is None]
    rule = next(iter(got.values())).rule if got else "seeds"
    if not got:
        return Verdict(rule, CANNOT, "no seed has the numbers")
    per = "; ".join(f"seed {s}: {v.verdict}" + (f" ({v.short})" if v.short else "") for s, v in got.items())
    lacking = (
        f"; seed{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}: not in the seeds table"
        if missing
        else ""
    )
    n = len(got)
    if n == 1:
        ((s, v),) = got.items()
        return Verdict(rule, v.verdict, f"{v.verdict} on one training seed's numbers (seed {s}{lacking})", v.short)
    counts = Counter(v.verdict for v in got.values())
    if len(counts) == 1 and not missing:
        (v,) = counts
        if v == CANNOT:
            return Verdict(rule, CANNOT, f"on none of the {n} training seeds can the table say ({per})")
        return Verdict(rule, f"{v} on every seed", f"{v}, on every one of the {n} training seeds ({per})")
    if set(counts) == {CANNOT}:
        return Verdict(
            rule, CANNOT, f"on none of the {n} training seeds with the numbers can the table say ({per}{lacking})"
        )
    order = sorted(counts, key=lambda v: (v == CANNOT, -counts[v], v))
    verdict = ", ".join(f"{v} on {counts[v]} of {len(verdicts)} seeds" for v in order)
    return Verdict(rule, verdict, f"{verdict} ({per}{lacking})")


def stated(
    verdicts: dict[int, Verdict | None],
    seed: int,
    lead: str,
    meaning: dict[str, str] | None = None,
    lead_one: str = "",
) -> Verdict:
    """The finding's sentence of a rule applied seed by seed (`over_seeds`). With two or more seeds the
    sentence is `lead`, the verdict over seeds and each seed's numbers (`Verdict.short`), and where the
    verdict holds on every seed what it means (`meaning[verdict]`); no seed's numbers stand for the
    others. With this study's seed alone: `lead_one` and its own sentence, said to be one seed's."""
    got = {s: v for s, v in verdicts.items() if v is not None}
    over = over_seeds(verdicts)
    if len(got) <= 1:
        mine = got.get(seed) or next(iter(got.values()), None)
        if mine is None:
            return Verdict(over.rule, CANNOT, f"{lead}: no numbers")
        only = next(iter(got))
        return Verdict(
            mine.rule, mine.verdict, f"{lead_one}{mine.sentence} (one training seed's numbers: seed {only})", mine.short
        )
    text = f"{lead}: {over.sentence}"
    every = over.verdict.endswith(" on every seed")
    v = over.verdict[: -len(" on every seed")] if every else ""
    if every and meaning and v in meaning:
        text += f": {meaning[v]}"
    return Verdict(over.rule, over.verdict, text, over.short)
