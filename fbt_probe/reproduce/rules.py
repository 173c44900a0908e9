"""The findings' rules: each turns a small table into a verdict and its sentence, by a criterion
stated once here and printed in the report (`CRITERIA`). Nothing here reads files or runs a model;
`findings.py` feeds the study's tables in. Every rule has a test that feeds it a table where the
opposite verdict is true (tests/test_rules.py).

| rule          | table it reads                                              | verdicts                                  |
|---------------|-------------------------------------------------------------|-------------------------------------------|
| trend         | per pair: group_id, length_knob, value                      | rises / falls / not monotone              |
| directions    | per pair: group_id, label (the receiving sample's), value   | both / one direction only / neither       |
| redundancy    | a replacement's pooled answer accuracy (value, low, high)   | redundant / needed                        |
| recomputable  | each task's standard answer accuracy (value, low, high)     | recomputable / not                        |
| readout       | depth-0 and carried-state probe accuracy per model          | read-out / not                            |
| replication   | ours beside the paper's, per figure                         | replicates / does not replicate           |
| das           | DAS k = 1 and full-swap IIA, on the model and its control   | exceeds (illusion pattern) / within       |
| sae           | per k: label-latent and random-active shares of the swap      | sparse at k / not sparse                  |
| sae-grid      | the same per SAE of a grid (seeds × widths, demo-sized data) | sparse at k on all / n of N / none        |
| contraction   | state change at pass 2 and the last pass; per-seed ratios    | contracts / does not contract             |
| paired        | feedback - baseline over shared groups (difference, CI, n)   | higher / lower / not resolved / same      |
| depth         | answer accuracy per model × k × mode (value, low, high)     | separates at k / does not separate        |
| depth-seeds   | the depth verdict of each training seed's table               | on every seed / on m of n / on no seed    |
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fbt_probe.stats import group_wilson

TREND_BOOT = 2000
FOLLOWS, IGNORES = 0.9, 0.1  # a swap direction "flips" at or above FOLLOWS, "does not" at or below IGNORES
REDUNDANT = 0.9  # zero replacement leaves the answer at or above this (its interval above chance): redundant
RECOMPUTABLE = 0.95  # standard prefill's accuracy at or above this on every task, each interval above chance
READOUT = 0.02  # depth 0 within this of the carried-state probe: a read-out of h(T-1)
CONTRACTS_BELOW = 0.1  # last pass's state change below this share of pass 2's: contracts
FLAT_LOSS = 0.1  # Fig. 3 replicates when the last pass's validation loss is within this (nats) of pass 1's
CHANCE = 0.5
DEPTH_CHANCE = 0.65  # serial depth: `standard` (and the baseline, every mode) at or below this is "at chance"
DEPTH_SOLVED = 0.9  # a feedback mode at or above this (its Wilson interval above chance) "answers" k

CRITERIA = {
    "trend": (
        "a trend word (rises, falls) is used only when the slope of the per-length means against the "
        "length's rank has a group-bootstrap 95 % CI that excludes 0 and the means move the same way at "
        "every step; otherwise the values are listed"
    ),
    "directions": (
        f"a swap flips the answer in one direction only when the answer follows the swapped-in state in at "
        f"least {FOLLOWS:.0%} of one direction's pairs and at most {IGNORES:.0%} of the other's"
    ),
    "redundancy": (
        f"the carried state is called largely redundant when replacing it with zeros leaves the answer accuracy "
        f"at or above {REDUNDANT} with a Wilson interval above chance, and needed when the interval's upper end "
        f"is below {REDUNDANT}"
    ),
    "recomputable": (
        f"a model can recompute the answer without the carried state when its standard-prefill answer "
        f"accuracy is at least {RECOMPUTABLE} on every task with a Wilson interval above chance"
    ),
    "readout": (
        f"depth 0 under `recurrent:1` is a read-out of h(T-1) when its probe accuracy is within {READOUT} of "
        "the probe on the carried state itself"
    ),
    "fig7a": (
        "Fig. 7a replicates when the depth-0 `recurrent:1` accuracy's lower bound is at least 0.90 and "
        "standard prefill's interval holds chance (paper: 0.996 / 1.0 and chance)"
    ),
    "fig7b": (
        "Fig. 7b replicates when `full` reads at least as well as every other mode (within 0.02) averaged over "
        "depths 1..L and its answer accuracy is above chance (paper: `full` best at depth)"
    ),
    "fig3": (
        f"Fig. 3 replicates when validation loss at the last pass is within {FLAT_LOSS} nats of pass 1's "
        "(paper: flat to 30 passes)"
    ),
    "das": (
        "DAS is said to exceed the full-vector swap when its k = 1 interchange accuracy's Wilson lower bound is "
        "above the full swap's accuracy; the untrained-fusion baseline, where the fusion carries no learned "
        "variable, is its control"
    ),
    "sae": (
        "an SAE is said to carry the swap's effect in k latents when the top-k label latents carry at least 0.8 "
        "of the full-state swap's effect and k random latents active in the same pairs carry less (their "
        "intervals apart); k is quoted against the most latents a pair can have active"
    ),
    "depth": (
        f"the serial-depth task separates the modes at k when the feedback model's `standard` answer accuracy is at "
        f"most {DEPTH_CHANCE} there, a feedback mode's is at least {DEPTH_SOLVED} with its Wilson lower bound (n = "
        f"groups) above chance, and the no-feedback baseline's is at most {DEPTH_CHANCE} under every mode; `standard` "
        f"is at chance from k = N on when it is at most {DEPTH_CHANCE} at N and every larger k, a feedback mode "
        f"answers up to k = M when M is the largest k where it reaches {DEPTH_SOLVED} with its lower bound above chance"
    ),
    "depth-seeds": (
        "over training seeds, the serial-depth criterion is applied to each seed's own table, and the modes are "
        "said to separate only where they do on every seed"
    ),
    "sae-grid": (
        "the SAE claim is counted over a grid of TopK SAEs (SAE seeds × widths, and one trained on demo-sized "
        "data), each judged by the criterion above with its own label latents and random control; the sentence "
        "quotes the k at which it holds on the most SAEs (the smallest such k) and says on how many"
    ),
    "contraction": (
        f"the iteration contracts when the carried state's change at the last pass is below {CONTRACTS_BELOW} "
        "of its change at pass 2"
    ),
    "paired": (
        "a contrast between the two models is the paired difference feedback − baseline over the groups both "
        "share, with a percentile group bootstrap that draws those groups once for both models; the feedback "
        "model is said to read higher (lower) only when that interval lies above (below) 0"
    ),
}


@dataclass(frozen=True)
class Verdict:
    rule: str
    verdict: str
    sentence: str


def fmt(p, lo, hi) -> str:
    """'**0.91** [0.85, 0.95]' ('n/a' for a missing estimate)."""
    return "n/a" if p != p else f"**{p:.2f}** [{lo:.2f}, {hi:.2f}]"


# ----------------------------------------------------------------------------- trend
def trend_slope_ci(per_pair: pd.DataFrame, n_boot: int = TREND_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(slope, low, high) of the per-length means against the length's rank (0, 1, 2, ...), with the
    percentile group bootstrap: groups resampled with replacement, each with its pairs at every length."""
    lengths = sorted(per_pair["length_knob"].unique())
    rank = {k: i for i, k in enumerate(lengths)}
    x = per_pair["length_knob"].map(rank).to_numpy()
    v = per_pair["value"].to_numpy(dtype=float)
    g_codes, g_index = pd.factorize(per_pair["group_id"])
    G, L = len(g_index), len(lengths)
    sums = np.zeros((G, L))
    counts = np.zeros((G, L))
    np.add.at(sums, (g_codes, x), v)
    np.add.at(counts, (g_codes, x), 1)

    def slope(w):
        s, c = (w[:, None] * sums).sum(0), (w[:, None] * counts).sum(0)
        keep = c > 0
        if keep.sum() < 2:
            return np.nan
        return np.polyfit(np.arange(L)[keep], s[keep] / c[keep], 1)[0]

    theta = slope(np.ones(G))
    rng = np.random.default_rng(seed)
    boots = np.array([slope(np.bincount(rng.integers(0, G, G), minlength=G).astype(float)) for _ in range(n_boot)])
    boots = boots[~np.isnan(boots)]
    lo, hi = np.quantile(boots, [0.025, 0.975]) if len(boots) else (np.nan, np.nan)
    return float(theta), float(lo), float(hi)


def trend(per_pair: pd.DataFrame, what: str, n_boot: int = TREND_BOOT, seed: int = 0) -> Verdict:
    """How `what` (a per-pair value) changes with length: rises / falls / is not monotone."""
    means = per_pair.groupby("length_knob")["value"].mean().sort_index()
    listed = ", ".join(f"{m:.2f}" for m in means) + " at lengths " + ", ".join(str(int(k)) for k in means.index)
    if len(means) < 2:
        return Verdict("trend", "single-length", f"{what} is measured at one length ({listed})")
    s, lo, hi = trend_slope_ci(per_pair, n_boot, seed)
    steps = np.sign(np.diff(means.to_numpy()))
    slope_ci = f"slope per length step {s:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    if lo > 0 and (steps > 0).all():
        return Verdict("trend", "rises", f"{what} rises with length: {listed} ({slope_ci})")
    if hi < 0 and (steps < 0).all():
        return Verdict("trend", "falls", f"{what} falls with length: {listed} ({slope_ci})")
    return Verdict("trend", "not-monotone", f"{what} does not vary monotonically with length: {listed} ({slope_ci})")


# ----------------------------------------------------------------------------- swap directions
def directions(per_pair: pd.DataFrame, what: str = "the answer") -> Verdict:
    """Whether `what` follows the swapped-in state in each swap direction (`label`: the receiving
    sample's label; `value`: 1 where it follows), Wilson intervals at n = groups."""
    parts, rates = [], {}
    for label, g in per_pair.groupby("label"):
        n_g = g["group_id"].nunique()
        p, lo, hi = group_wilson(float(g["value"].mean()), n_g)
        rates[int(label)] = p
        parts.append(f"{fmt(p, lo, hi)} into label-{int(label)} samples ({len(g)} pairs, {n_g} groups)")
    text = f"{what} follows the swapped-in state at " + " and ".join(parts)
    hi_dir = [k for k, p in rates.items() if p >= FOLLOWS]
    lo_dir = [k for k, p in rates.items() if p <= IGNORES]
    if len(rates) == 2 and len(hi_dir) == 1 and len(lo_dir) == 1:
        return Verdict(
            "directions", "one-direction", text + f": it flips in one direction only (into label-{hi_dir[0]})"
        )
    if rates and all(p >= FOLLOWS for p in rates.values()):
        return Verdict("directions", "both", text + ": it flips in both directions")
    if rates and all(p <= IGNORES for p in rates.values()):
        return Verdict("directions", "neither", text + ": it flips in neither direction")
    return Verdict("directions", "partial", text)


# ----------------------------------------------------------------------------- redundancy
def redundancy(
    zero: tuple[float, float, float], swap_norm: float | None, task: str, mean: tuple[float, float, float] | None = None
) -> Verdict:
    """zero (and mean): (answer accuracy, Wilson low, high) with the carried state replaced by zeros
    (by the mean carried state)."""
    p, lo, hi = zero
    text = f"with the carried state replaced by zeros, {task} is answered at {fmt(p, lo, hi)}"
    if mean is not None:
        text += f" (by the mean state: {fmt(*mean)})"
    if p >= REDUNDANT and lo > CHANCE:
        extra = "" if swap_norm is None else f", although a swap moves it by a normalized {swap_norm:.2f}"
        return Verdict(
            "redundancy",
            "redundant",
            text + f": the state is largely redundant{extra} (the model reads it when it is there, "
            "but recovers the answer without it)",
        )
    if hi < REDUNDANT:
        return Verdict("redundancy", "needed", text + ": without the state the answer is lost in part")
    return Verdict("redundancy", "unresolved", text + ": too few groups to say whether the state is needed")


# ----------------------------------------------------------------------------- recomputable
def recomputable(model_label: str, accs: dict[str, tuple[float, float, float]]) -> Verdict:
    """accs: task -> (standard answer accuracy, Wilson low, high)."""
    chance = [t for t, (_, lo, _) in accs.items() if lo <= CHANCE]
    weak = [t for t, (p, lo, _) in accs.items() if lo > CHANCE and p < RECOMPUTABLE]
    if accs and not chance and not weak:
        low = min(p for p, _, _ in accs.values())
        return Verdict(
            "recomputable",
            "recomputable",
            f"{model_label} answers every task under standard prefill (lowest accuracy {low:.2f}): the answer can "
            "always be recomputed without the carried state, so an effect of the state shows that the model reads "
            "it when it is there, not that the task needs it",
        )
    if chance:
        return Verdict(
            "recomputable",
            "not-answered",
            f"{model_label} does not answer {', '.join(chance)} above chance under standard prefill: the probes and "
            "causal tests there read a model that has not learned the task",
        )
    return Verdict(
        "recomputable",
        "not-recomputable",
        f"{model_label} answers {', '.join(weak)} above chance but below {RECOMPUTABLE} under standard prefill: "
        "there the carried state may be needed",
    )


# ----------------------------------------------------------------------------- read-out of h(T-1)
def readout(task: str, pairs: dict[str, tuple[float, float]]) -> Verdict:
    """pairs: model -> (depth-0 `recurrent:1` probe accuracy, carried-state probe accuracy)."""
    said = "; ".join(f"{m} {d:.3f} at depth 0 vs {c:.3f} on the carried state" for m, (d, c) in pairs.items())
    if pairs and all(abs(d - c) <= READOUT for d, c in pairs.values()):
        return Verdict(
            "readout",
            "readout",
            f"On {task}, depth 0 under `recurrent:1` reads what h(T-1) holds ({said}): the feedback − baseline gap "
            "there compares the two networks' top states, not a learned fusion",
        )
    return Verdict("readout", "transformed", f"On {task}, depth 0 under `recurrent:1` differs from h(T-1) ({said})")


# ----------------------------------------------------------------------------- replication
def fig7a(task: str, rec: tuple[float, float, float], std: tuple[float, float, float], paper: float) -> Verdict:
    ok = rec[1] >= 0.9 and std[1] <= CHANCE <= std[2]
    verdict = "replicates" if ok else "does not replicate"
    return Verdict(
        "fig7a",
        verdict,
        f"Fig. 7a on {task} {verdict}: depth 0 reads {fmt(*rec)} under `recurrent:1` and {fmt(*std)} under "
        f"`standard` (paper: {paper:.3f} and chance)",
    )


def fig7b(task: str, by_mode: dict[str, float], full_answer: tuple[float, float, float] | None) -> Verdict:
    """by_mode: mode -> probe accuracy averaged over depths 1..L."""
    listed = ", ".join(f"`{m}` {v:.2f}" for m, v in by_mode.items())
    if "full" not in by_mode:
        return Verdict("fig7b", "not-run", f"Fig. 7b on {task}: `full` was not probed ({listed})")
    best = max(v for m, v in by_mode.items() if m != "full") if len(by_mode) > 1 else -1.0
    broken = full_answer is not None and full_answer[2] < CHANCE
    ok = by_mode["full"] >= best - 0.02 and not broken
    verdict = "replicates" if ok else "does not replicate"
    text = (
        f"Fig. 7b on {task} {verdict}: mean probe accuracy over depths 1..L is {listed} (paper: `full` best at depth)"
    )
    if full_answer is not None:
        text += f"; under `full` the model answers at {fmt(*full_answer)}"
        if broken:
            text += ", so its `full` probes describe a regime in which the model does not answer the task"
    return Verdict("fig7b", verdict, text)


def fig3(loss_by_pass: pd.Series) -> Verdict:
    """loss_by_pass: validation loss indexed by pass (1..N)."""
    first, last_pass = float(loss_by_pass.loc[1]), int(loss_by_pass.index.max())
    shown = [p for p in (1, 2, 4, 8, 16, 32) if p in loss_by_pass.index]
    listed = ", ".join(f"{loss_by_pass.loc[p]:.3g} at pass {p}" for p in shown)
    ok = float(loss_by_pass.loc[last_pass]) - first <= FLAT_LOSS
    verdict = "replicates" if ok else "does not replicate"
    return Verdict("fig3", verdict, f"Fig. 3 {verdict}: validation loss is {listed} (paper: flat to 30 passes)")


# ----------------------------------------------------------------------------- contraction
def contraction(
    d2: float,
    dlast: float,
    last: int,
    seed_ratios: list[float] | None = None,
    ci: tuple[float, float] | None = None,
    documents: int | None = None,
) -> Verdict:
    """The ratio dlast / d2 against CONTRACTS_BELOW; with `ci` (the ratio's bootstrap interval over
    `documents`) the verdict needs the whole interval on one side, else it is unresolved."""
    ratio = dlast / d2
    shown = f"ratio {ratio:.2g}" + ("" if ci is None else f" [{ci[0]:.2g}, {ci[1]:.2g}]")
    if documents:
        shown += f" over {documents} documents"
    if ci is None:
        verdict = "contracts" if ratio < CONTRACTS_BELOW else "does not contract"
    elif ci[1] < CONTRACTS_BELOW:
        verdict = "contracts"
    elif ci[0] >= CONTRACTS_BELOW:
        verdict = "does not contract"
    else:
        verdict = f"is not resolved at the {CONTRACTS_BELOW} threshold (its interval holds it)"
    move = "falls" if dlast < d2 else "grows"
    text = (
        f"the carried state's change {move} from {d2:.3g} at pass 2 to {dlast:.3g} at pass {last} ({shown}; "
        f"below {CONTRACTS_BELOW} counts as contracting): the iteration {verdict}"
    )
    if seed_ratios is not None and len(seed_ratios) >= 2:
        k = sum(r < CONTRACTS_BELOW for r in seed_ratios)
        text += (
            f"; over training seeds it contracts on {k} of {len(seed_ratios)} (ratios "
            + ", ".join(f"{r:.2g}" for r in seed_ratios)
            + ")"
        )
        if 0 < k < len(seed_ratios):
            verdict = f"contracts on {k} of {len(seed_ratios)} seeds"
    return Verdict("contraction", verdict, text)


# ----------------------------------------------------------------------------- DAS illusion control
def das_illusion(
    task: str,
    das: tuple[float, float, float],
    full_swap: float,
    control: tuple[tuple[float, float, float], float] | None = None,
) -> Verdict:
    """das: (DAS k = 1 IIA, Wilson low, high) on the model; full_swap: the full-vector interchange's IIA;
    control: the same two on the untrained-fusion baseline."""
    text = f"On {task}, DAS with k = 1 reaches an IIA of {fmt(*das)} against the full-vector swap's {full_swap:.2f}"
    ctrl = ""
    if control is not None:
        (c, clo, chi), cfull = control
        ctrl = (
            f"; on the untrained-fusion baseline, whose fusion carries no learned variable, DAS reads {fmt(c, clo, chi)} "
            f"against its full swap's {cfull:.2f}"
        )
        if clo > cfull:
            ctrl += " (the control shows the same excess, so the subspace need not be what the model uses)"
    if das[1] > full_swap:
        return Verdict(
            "das",
            "exceeds",
            text + ": a one-dimensional subspace moves the answer more than the whole vector, the pattern of the "
            "interpretability illusion (a subspace that activates a pathway the model does not use)" + ctrl,
        )
    return Verdict("das", "within", text + ctrl)


# ----------------------------------------------------------------------------- SAE sparsity
SAE_SHARE = 0.8


def _sae_holds(feats: pd.DataFrame, rand: pd.DataFrame, k) -> bool:
    """The `sae` criterion at k: the top-k label latents carry at least SAE_SHARE and the k random active
    latents' interval lies below theirs (a k without the control is judged on the label latents alone)."""
    r = feats.loc[k]
    if r["fraction"] < SAE_SHARE:
        return False
    return not (k in rand.index and rand.loc[k, "ci_high"] >= r["ci_low"])


def _sae_split(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    feats = table[table["condition"] == "features"].set_index("k").sort_index()
    rand = table[table["condition"] == "random"].set_index("k")
    return feats, rand


def sae_sparsity(task: str, table: pd.DataFrame, max_active: int | None) -> Verdict:
    """table: rows of one task with columns condition ("features": the top-k label latents, "random": k
    random active latents), k, fraction, ci_low, ci_high (shares of the full-state swap's effect)."""
    feats, rand = _sae_split(table)
    of = "" if max_active is None else f" of at most {max_active} active latents"
    for k, r in feats.iterrows():
        if not _sae_holds(feats, rand, k):
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
        )
    shown = []
    for k, r in feats.iterrows():
        c = f"{r['fraction']:.2f}"
        if k in rand.index:
            c += f" vs random {rand.loc[k, 'fraction']:.2f}"
        shown.append(f"k = {k}: {c}")
    return Verdict(
        "sae",
        "not sparse",
        f"{task}: not sparse — no k where the label latents carry {SAE_SHARE} of the swap's effect and k random "
        "active latents carry less ("
        + "; ".join(shown)
        + ("" if max_active is None else f"; a pair has at most {max_active} active latents")
        + ")",
    )


# ----------------------------------------------------------------------------- feedback - baseline
def bound(x: float, digits: int = 2) -> str:
    """An interval end as quoted: '-0.00' (a bound just below 0) written '0.00'."""
    s = f"{x:.{digits}f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s


def signed(x: float, digits: int = 2) -> str:
    """A difference as quoted: '+0.12', '-0.05', and '0.00' where it rounds to 0 (no '-0.00')."""
    s = f"{x:+.{digits}f}"
    return s[1:] if float(s) == 0 else s


def paired(what: str, diff: tuple[float, float, float, int] | None) -> Verdict:
    """diff: (feedback − baseline, low, high, shared groups) from the `paired` table (`stats.paired_difference`).
    A zero-width interval means every resample gave the same difference (the models differ by the same
    amount in every shared group); it is said in words, not printed as an interval."""
    if diff is None or diff[3] == 0 or diff[0] != diff[0]:
        return Verdict("paired", "not-paired", f"{what}: no group was measured on both models")
    d, lo, hi, n = diff
    groups = f"{n} group{'s' if n != 1 else ''}"
    if lo == hi:
        if d == 0:
            return Verdict(
                "paired",
                "same",
                f"{what}: feedback − baseline **0.00** in every one of the {groups} both models share (paired: the "
                "two models read the same in each, so this contrast has no power)",
            )
        return Verdict(
            "paired",
            "constant",
            f"{what}: feedback − baseline **{signed(d)}** in every one of the {groups} both models share (paired: no "
            "spread between groups to resample)",
        )
    shown = f"{what}: feedback − baseline **{signed(d)}** [{bound(lo)}, {bound(hi)}] (paired, n = {groups})"
    if lo > 0:
        return Verdict("paired", "higher", shown)
    if hi < 0:
        return Verdict("paired", "lower", shown)
    return Verdict("paired", "not-resolved", shown + ", an interval that holds 0")


# ----------------------------------------------------------------------------- serial depth
def _solves(r) -> bool:
    return r["value"] >= DEPTH_SOLVED and r["ci_low"] > CHANCE


def depth_separation(table: pd.DataFrame, task: str = "compose-s3") -> Verdict:
    """table: answer accuracy per model ("feedback", "baseline") × k × mode, columns model, k, mode and
    the value with its Wilson interval (`accuracy` or `value`, ci_low, ci_high). Separates at k when
    the feedback model's `standard` is at most DEPTH_CHANCE, one of its feedback modes at least
    DEPTH_SOLVED with its lower bound above chance, and the baseline at most DEPTH_CHANCE under every
    mode (`CRITERIA["depth"]`)."""
    t = table.rename(columns={"accuracy": "value"}) if "value" not in table.columns else table
    fb = t[t["model"] == "feedback"]
    base = t[t["model"] == "baseline"]
    ks = sorted(int(k) for k in fb["k"].unique())
    feeding = [m for m in dict.fromkeys(fb["mode"]) if m != "standard"]

    def cell(model_rows, k, mode):
        r = model_rows[(model_rows["k"] == k) & (model_rows["mode"] == mode)]
        return None if r.empty else r.iloc[0]

    def said(r) -> str:
        return fmt(r["value"], r["ci_low"], r["ci_high"])

    std = {k: cell(fb, k, "standard") for k in ks}
    separated = []
    for k in ks:
        s = std[k]
        solved = [m for m in feeding if (c := cell(fb, k, m)) is not None and _solves(c)]
        b = base[base["k"] == k]
        base_ok = not b.empty and bool((b["value"] <= DEPTH_CHANCE).all())
        if s is not None and s["value"] <= DEPTH_CHANCE and solved and base_ok:
            separated.append((k, solved))
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
        return Verdict(
            "depth",
            "does not separate",
            f"no knob value separates the modes on {task}: at no k is the feedback model's `standard` at or below "
            f"{DEPTH_CHANCE} while a feedback mode reaches {DEPTH_SOLVED} (its interval above chance) and the baseline "
            f"stays at or below {DEPTH_CHANCE} under every mode (best cells: " + "; ".join(per_k) + ")",
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
        f"separate at k = {where} (" + "; ".join(shown) + ")",
    )


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
    ("features", "random"; others ignored), k, fraction, ci_low, ci_high, max_active. Each SAE is judged
    by `sae_sparsity`'s criterion at each k; the sentence names the k at which the claim holds on the
    most SAEs (the smallest such k), quotes the first SAE for which it holds there, and gives the range
    of both shares at that k over every SAE; with no such k, 'not sparse on any SAE'."""
    table = table[table["condition"].isin(["features", "random"])]
    saes = list(dict.fromkeys(table["sae"]))
    n = len(saes)
    split = {s: _sae_split(table[table["sae"] == s]) for s in saes}
    most = {s: int(table.loc[table["sae"] == s, "max_active"].iloc[0]) for s in saes}
    ks = sorted({int(k) for f, _ in split.values() for k in f.index})
    holds = {k: [s for s in saes if k in split[s][0].index and _sae_holds(*split[s], k)] for k in ks}
    best = max(ks, key=lambda k: (len(holds[k]), -k)) if ks else None
    smallest = {s: next((k for k in ks if s in holds[k]), None) for s in saes}

    def at(k, cond: int) -> list[float]:
        """The share at k over every SAE that has it (cond 0: label latents, 1: random active)."""
        return [float(split[s][cond].loc[k, "fraction"]) for s in saes if k in split[s][cond].index]

    if best is None or not holds[best]:
        f0, r0 = split[saes[0]]
        shown = next((k for k in f0.index if f0.loc[k, "fraction"] >= SAE_SHARE), f0.index.max() if len(f0) else None)
        if shown is None:
            return Verdict("sae-grid", "not sparse", f"{task}: no feature swap on any SAE")
        rnd = f" vs random-{shown} {r0.loc[shown, 'fraction']:.2f}" if shown in r0.index else ""
        over = f"; over the {n} SAEs top-{shown} {_span(at(shown, 0))}"
        if at(shown, 1):
            over += f", random-{shown} {_span(at(shown, 1))}"
        return Verdict(
            "sae-grid",
            "not sparse",
            f"{task}: not sparse {'on any of the ' + str(n) + ' SAEs' if n > 1 else 'on the one SAE'} — no k where the "
            f"label latents carry {SAE_SHARE} of the full-state swap's effect and as many random active latents "
            f"carry less ({saes[0]}: top-{shown} {f0.loc[shown, 'fraction']:.2f}{rnd}{over if n > 1 else ''}; a "
            f"pair has at most {_span(most.values(), 0)} active latents)",
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
    return Verdict("sae-grid", verdict, text)


def depth_over_seeds(verdicts: dict[int, Verdict]) -> Verdict:
    """`depth_separation`'s verdict on each training seed's table (seed -> verdict): the prediction of
    a positive control holds only where the modes separate on every seed (`CRITERIA["depth-seeds"]`)."""
    seeds = sorted(verdicts)
    sep = [s for s in seeds if verdicts[s].verdict.startswith("separates")]
    n = len(seeds)
    named = ", ".join(map(str, seeds))
    if not sep:
        return Verdict(
            "depth-seeds", "on no seed", f"no knob value separates the modes on any of the {n} training seeds ({named})"
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
