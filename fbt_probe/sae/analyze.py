"""`fbt-probe sae analyze`: every SAE table of one model, SAE and dataset, into one folder.

Files (parquet unless named): `reconstruction` (FVU, L0, dead latents per mode on the fed positions),
`loss_recovered` (`fbt_probe.sae.metrics`), `feature_tests` (wide rows) and `summary`
(`interventions.metrics.summarize`: Wilson for proportions, group bootstrap for means) of `fbt_probe.sae.features`, `fractions`
(per task and k: the feature swap's normalized effect over the full-state swap's, a ratio of pair
means with its normal group-bootstrap interval, `sae.metrics.ratio_ci`), `features` (per task the top label latents: mean
activation by label and length, how often active), `examples` (each top latent's max-activating
fed positions as text, the token whose top state is carried marked), `activations` (each top latent's
activation at every sample's final position, with its label and length: the histograms by label),
`analysis.json` (provenance), `figures/sae-swap.png`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fbt_probe.errors import FbtError
from fbt_probe.figures import save_figure
from fbt_probe.figures.sae import sae_swap
from fbt_probe.interventions.metrics import summarize, to_long
from fbt_probe.interventions.pairs import label_token_ids, pair_batches
from fbt_probe.io import write_json
from fbt_probe.marker import output_dir
from fbt_probe.modes import parse_mode
from fbt_probe.provenance import provenance
from fbt_probe.sae.data import collect
from fbt_probe.sae.features import KS, feature_tests, final_states, rankings
from fbt_probe.sae.metrics import loss_recovered, loss_recovered_rows, ratio_ci, reconstruction

TOP = 4  # latents per task in the feature table and the browser
EXAMPLES = 5  # max-activating positions per latent (distinct texts)


COMMAND = "sae analyze"  # the output marker's command
KIND = "an SAE analysis folder written by fbt-probe sae analyze"


def no_pairs_above_gap(wide: pd.DataFrame, mode: str) -> FbtError:
    pairs = wide["pair_id"].nunique() if "pair_id" in wide else 0
    return FbtError(
        f"no pair above the minimum gap: all {pairs} pairs' clean and corrupted logit differences are closer than "
        f"the minimum gap under {mode}, so no feature can be tested (nothing written; use longer inputs, more "
        "pairs or a trained model)"
    )


def fractions(wide: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per task and k: Σ feature-swap normalized / Σ state-swap normalized over the same pairs."""
    sw = wide[(wide["experiment"] == "sae-feature-swap") & ~wide["tiny_gap"].astype(bool)]
    per = sw.groupby(["task", "condition", "subspace_dim", "pair_id"], sort=True).agg(
        value=("normalized", "mean"), group_id=("group_id", "first")
    )
    per = per.reset_index()
    state = per[per["condition"] == "state"].set_index(["task", "pair_id"])
    out = []
    for (task, cond, k), g in per[per["condition"] != "state"].groupby(["task", "condition", "subspace_dim"]):
        g = g.set_index(["task", "pair_id"]).join(state["value"].rename("full"), how="inner")
        v, lo, hi = ratio_ci(g["value"].to_numpy(), g["full"].to_numpy(), g["group_id"].to_numpy(), n_boot, seed)
        out.append(
            {
                "task": task,
                "condition": cond,
                "k": int(k),
                "fraction": v,
                "ci_low": lo,
                "ci_high": hi,
                "pairs": len(g),
                "groups": int(g["group_id"].nunique()),
            }
        )
    return pd.DataFrame(out)


VISIBLE = {"\n": "⏎", " ": "␣", "\t": "⇥", "": "∅"}


def _text(tokenizer, ids, mark: int, width: int = 12) -> str:
    lo = max(0, mark - width)
    words = [str(tokenizer.decode([int(t)])) if tokenizer is not None else str(int(t)) for t in ids[lo : mark + 2]]
    i = mark - lo
    words[i] = f"[[{words[i].strip() or VISIBLE.get(words[i], repr(words[i]))}]]"  # a whitespace token shown
    return ("… " if lo else "") + " ".join(w.strip() for w in words)


@torch.no_grad()
def feature_table(
    model, sae, df, hook, mode, order: dict, batch_size: int = 64
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per-latent table, max-activating examples, final-position activations) of each task's top label latents."""
    feats, examples, finals = [], [], []
    tok = getattr(model, "tokenizer", None)
    for task, ranking in order.items():
        sub = df[df["task"] == task].reset_index(drop=True)
        x, idx = collect(model, sub, hook, mode, "fed", batch_size)
        z = sae.encode(x)
        last = idx.groupby("row")["position"].transform("max").to_numpy() == idx["position"].to_numpy()
        meta = sub.iloc[idx["row"].to_numpy()].reset_index(drop=True)
        for rank, j in enumerate(ranking[:TOP]):
            a = z[:, int(j)].double().numpy()
            r = {"task": task, "rank": rank + 1, "latent": int(j), "active_share": float((a > 0).mean())}
            for lab in (0, 1):
                sel = last & (meta["label"].to_numpy() == lab)
                r[f"final_mean_label{lab}"] = float(a[sel].mean()) if sel.any() else float("nan")
            for kn in sorted(meta["length_knob"].unique()):
                sel = last & (meta["length_knob"].to_numpy() == kn)
                r[f"final_mean_len{int(kn)}"] = float(a[sel].mean())
            feats.append(r)
            finals.append(
                pd.DataFrame(
                    {
                        "task": task,
                        "rank": rank + 1,
                        "latent": int(j),
                        "pair_id": meta["pair_id"].to_numpy()[last],
                        "label": meta["label"].to_numpy()[last].astype(int),
                        "length_knob": meta["length_knob"].to_numpy()[last].astype(int),
                        "activation": a[last],
                    }
                )
            )
            seen: set = set()
            for i in np.argsort(-a, kind="stable"):  # the largest activations, one per distinct text
                if len(seen) == EXAMPLES or a[i] <= 0:
                    break
                row, pos = int(idx["row"].iloc[i]), int(idx["position"].iloc[i])
                ids = sub["token_ids"].iloc[row]
                text = _text(tok, ids, pos - 1)
                if text in seen:
                    continue
                seen.add(text)
                examples.append(
                    {
                        "task": task,
                        "latent": int(j),
                        "example": len(seen),
                        "activation": float(a[i]),
                        "label": int(sub["label"].iloc[row]),
                        "position": pos,
                        "final": bool(pos == len(ids) - 1),
                        "text": text,
                    }
                )
    return pd.DataFrame(feats), pd.DataFrame(examples), pd.concat(finals, ignore_index=True) if finals else None


def quality(model, sae, df, modes, batch_size: int = 64, n_boot: int = 1000, seed: int = 0):
    """(reconstruction per mode on the fed positions, loss recovered per task x mode) of `sae` on its hook."""
    hook = sae.hook_name or "fusion.hook_feedback"
    recon, rows = [], []
    for m in modes:
        x, _ = collect(model, df, hook, m, "fed", batch_size)
        recon.append({"mode": m, **reconstruction(sae, x)})
        rows.append(loss_recovered_rows(model, sae, df, hook, [m], x.mean(0), batch_size))
    return pd.DataFrame(recon), loss_recovered(pd.concat(rows), n_boot, seed)


def analyze(
    model,
    sae,
    df: pd.DataFrame,
    out: str | Path,
    mode: str = "recurrent:1",
    modes=None,
    ks=KS,
    max_pairs: int | None = None,
    batch_size: int = 64,
    seed: int = 0,
    n_boot: int = 1000,
    force: bool = False,
    info: dict | None = None,
    figures: bool = True,
    empty_ok: bool = False,
) -> dict:
    """Every table into `out`. Where no pair's gap reaches the minimum the feature tests are empty:
    refused (`no_pairs_above_gap`, nothing written) unless `empty_ok` (a study, whose report says so)."""
    hook = sae.hook_name or "fusion.hook_feedback"
    modes = list(dict.fromkeys(parse_mode(m) for m in [mode, *(modes or [])]))  # parsed once, here
    mode = modes[0]
    with output_dir(Path(out), COMMAND, force=force, kind=KIND) as tmp:
        recon, lr = quality(model, sae, df, modes, batch_size, n_boot, seed)
        recon.to_parquet(tmp / "reconstruction.parquet", index=False)
        lr.to_parquet(tmp / "loss_recovered.parquet", index=False)
        wide = feature_tests(model, sae, df, hook, mode, ks, max_pairs, batch_size, seed=seed)
        wide.to_parquet(tmp / "feature_tests.parquet", index=False)
        summarize(to_long(wide), n_boot=n_boot, seed=seed).to_parquet(tmp / "summary.parquet", index=False)
        fr = fractions(wide, n_boot, seed)
        if fr.empty and not empty_ok:
            raise no_pairs_above_gap(wide, mode)
        fr.to_parquet(tmp / "fractions.parquet", index=False)
        if figures and len(fr):
            fig = sae_swap(fr, model_label=str((info or {}).get("model", "")))
            (tmp / "figures").mkdir()
            save_figure(fig, tmp / "figures", "sae-swap", formats=("png",), dpi=150)
        label_ids = label_token_ids(df)
        batches = list(pair_batches(df, label_ids, batch_size, max_pairs))
        order = rankings(sae, final_states(model, batches, hook, mode), fold=False)
        # every position's state as the SAE was trained on it (jacobi:2 carries the standard pass's top
        # state into every position: recurrent:1's final-position state is one of them)
        browse = parse_mode(sae.cfg.metadata.get("mode") or "jacobi:2")  # as the SAE folder records it
        feats, ex, finals = feature_table(model, sae, df, hook, browse, order, batch_size)
        feats.to_parquet(tmp / "features.parquet", index=False)
        ex.to_parquet(tmp / "examples.parquet", index=False)
        if finals is not None:
            finals.to_parquet(tmp / "activations.parquet", index=False)
        write_json(
            tmp / "analysis.json",
            {
                "hook": hook,
                "mode": mode,
                "modes": modes,
                "ks": list(ks),
                "max_pairs": max_pairs,
                "seed": seed,
                "n_boot": n_boot,
                "sae": sae.cfg.to_saelens(),
                **(info or {}),
                "provenance": provenance(),
            },
        )
    return {"reconstruction": recon, "loss_recovered": lr, "fractions": fr}


def sparsity_sentence(fr: pd.DataFrame, task: str, share: float = 0.8) -> str:
    """'completion: 2 features carry 0.85 [0.80, 0.90] of the full-state swap' or 'not sparse'."""
    g = fr[(fr["task"] == task) & (fr["condition"] == "features")].sort_values("k")
    if g.empty:
        return f"{task}: no pairs"
    hit = g[g["fraction"] >= share]
    if hit.empty:
        best = g.iloc[-1]
        return (
            f"{task}: not sparse at k ≤ {int(best['k'])} — the top {int(best['k'])} features carry "
            f"{best['fraction']:.2f} [{best['ci_low']:.2f}, {best['ci_high']:.2f}] of the full-state swap's effect"
        )
    r = hit.iloc[0]
    return (
        f"{task}: {int(r['k'])} feature{'s' if r['k'] > 1 else ''} carry {r['fraction']:.2f} "
        f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}] of the full-state swap's effect ({int(r['pairs'])} pairs, {int(r['groups'])} groups)"
    )
