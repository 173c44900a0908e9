"""The lens sweep: under every prefill mode (and every Jacobi pass), what each depth predicts at the
final position of held-out task text, through the logit lens and a tuned lens -> tidy tables.

Activations come from the mode's one hooked pass (exact for every position, docs/modes.md); under
`jacobi:K` the hooks fire in every pass (`serial=True`) and each pass is its own line (`pass_index`;
pass k of jacobi:K is the final pass of jacobi:k). A pass's own logits are `model.normalized_logits` of `ln_final.hook_normalized`,
the model's operation on the same tensor, so both lenses equal them at the top depth.

The tuned lens is fitted once per model on positions of the *lens-train* pairs (pair groups drawn with
`seed`, every mode and pass pooled, KL to that pass's own logits), and every metric is reported on
the other, *lens-eval* pairs, so that one set of translators serves every line of the figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import save_file

from fbt_probe.errors import FbtError
from fbt_probe.figures.lens import lens_depth
from fbt_probe.hooks import act_name, depth_name
from fbt_probe.interventions.das_experiment import pair_components
from fbt_probe.interventions.edits import span
from fbt_probe.interventions.metrics import bootstrap_cis
from fbt_probe.interventions.pairs import label_token_ids, pair_batches
from fbt_probe.interventions.runner import dataset_hash
from fbt_probe.io import write_json
from fbt_probe.lens.lenses import TunedLens, fit_tuned_lens, kl_to, logit_lens
from fbt_probe.marker import output_dir
from fbt_probe.modes import Mode, check_distinct, parse_mode
from fbt_probe.provenance import provenance
from fbt_probe.stats import group_proportion

FORMAT = "fbt-probe.lens/1"
COMMAND = "lens"  # the output marker's command
LENS_KIND = "a lens results folder written by fbt-probe lens"

LENS_METRICS = {
    "p_correct": "softmax probability (whole vocabulary) of the sample's label word at the final position",
    "logit_diff": "logit[label word] - logit[other label word]",
    "top1": "the label word is the top-1 token",
    "kl_to_final": "KL(final logits of the same pass || lens logits), nats",
}


MAX_LENS_PASSES = 64  # jacobi:K under the lens: K hooked passes, every pass's residuals at every depth kept


@dataclass(frozen=True)
class LensConfig:
    modes: tuple[Mode, ...] = ("standard", "recurrent:1", "full", "jacobi:3")  # names parsed into Modes
    steps: int = 300
    """Tuned-lens optimizer steps (0: logit lens only)."""
    lr: float = 1e-3
    positions: int = 16
    """Training positions drawn per lens-train sample (the final position always among them)."""
    eval_fraction: float = 0.5
    """Share of each task's pair groups held out of tuned-lens training; every metric is on them."""
    max_pairs: int | None = None
    lengths: tuple[int, ...] | None = None
    batch_size: int = 32
    n_boot: int = 1000
    ci: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "modes", tuple(parse_mode(m) for m in self.modes))  # parsed once, here
        check_distinct(list(self.modes), list(self.modes))
        for m in self.modes:
            if m.parallel and m.k > MAX_LENS_PASSES:
                raise FbtError(
                    f"--mode {m}: the lens reads every pass of jacobi:K (K hooked passes over the whole input, each "
                    f"pass's residuals kept); expected K <= {MAX_LENS_PASSES} (the exact recurrence is --mode full)"
                )
        if not 0 <= self.seed < 2**63:
            raise FbtError(f"--seed {self.seed}: expected an integer 0..2**63-1")
        if not (_number(self.eval_fraction) and 0 < self.eval_fraction < 1):
            raise FbtError(f"--eval-fraction {self.eval_fraction}: expected a number in (0, 1)")
        if not (_number(self.lr) and self.lr > 0):
            raise FbtError(f"--lr {self.lr}: expected a finite number > 0")
        if not (_number(self.ci) and 0 < self.ci < 1):
            raise FbtError(f"ci {self.ci}: expected a number in (0, 1)")
        for name, low in (
            ("steps", 0),
            ("positions", 1),
            ("batch_size", 1),
            ("n_boot", 1),
            ("max_pairs", 1),
            ("seed", 0),
        ):
            value = getattr(self, name)
            if value is None and name == "max_pairs":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise FbtError(f"--{name.replace('_', '-')} {value}: expected an integer >= {low}")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


@dataclass
class LensResult:
    rows: pd.DataFrame
    summary: pd.DataFrame
    training: pd.DataFrame  # tuned-lens KL per step
    lens: TunedLens | None
    manifest: dict = field(default_factory=dict)


@torch.no_grad()
def pass_activations(model, tokens: torch.Tensor, mode: Mode) -> dict[int, dict]:
    """{pass_index: {"resid": {depth: [B, T, D]}, "logits": [B, T, V]}} under `mode` (see module doc)."""
    serial = mode.parallel and mode.k > 1
    names = [depth_name(d) for d in range(model.cfg.n_layers + 1)] + [act_name("ln_final")]
    store: dict = {}

    def grab(name):
        def hook(x, hook=None):
            ctx = model.hook_context
            store.setdefault((name, ctx.pass_index if serial else 1), []).append((span(model, x).start, x.detach()))
            return x

        return hook

    model.run_with_hooks(tokens, mode=mode, serial=serial, fwd_hooks=[(n, grab(n)) for n in names])
    out: dict = {}
    for (name, k), chunks in store.items():
        full = torch.cat([t for _, t in sorted(chunks, key=lambda c: c[0])], dim=1)
        entry = out.setdefault(k, {"resid": {}})
        if name == act_name("ln_final"):
            entry["logits"] = model.normalized_logits(full)  # the model's own top operation (gain, then the head)
        else:
            entry["resid"][names.index(name)] = full
    return out


def eval_rows(df: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
    """Bool per row of `df`: its pair group (groups joined through pairs, `pair_components`) is held out of
    tuned-lens training. Per task, round(fraction × units) units, at least one on each side."""
    comp = pair_components(df)
    held = np.zeros(len(df), dtype=bool)
    rng = np.random.default_rng(seed)
    for task in sorted(df["task"].unique()):
        mask = (df["task"] == task).to_numpy()
        units = sorted(set(comp[mask]))
        n_eval = min(len(units) - 1, max(1, int(round(fraction * len(units))))) if len(units) > 1 else 1
        chosen = {units[i] for i in rng.permutation(len(units))[:n_eval]}
        held |= mask & np.array([c in chosen for c in comp])
    return held


def _final_metrics(logits: torch.Tensor, final: torch.Tensor, target, other) -> dict[str, np.ndarray]:
    idx = torch.arange(logits.shape[0])
    p = torch.softmax(logits.double(), -1)
    return {
        "p_correct": p[idx, target].numpy(),
        "logit_diff": (logits[idx, target] - logits[idx, other]).double().numpy(),
        "top1": (logits.argmax(-1) == target).double().numpy(),
        "kl_to_final": kl_to(final, logits).double().numpy(),
    }


def run_lens(model, df: pd.DataFrame, cfg: LensConfig, label_ids: dict | None = None) -> LensResult:
    if df.empty:
        raise FbtError("dataset: no rows; nothing to run the lens on")
    label_ids = label_ids or label_token_ids(df)
    model.eval()
    dev = next(model.parameters()).device
    L = model.cfg.n_layers
    gen = torch.Generator().manual_seed(cfg.seed)
    finals, train_x, train_y = [], {d: [] for d in range(L + 1)}, []
    held_all = eval_rows(df.reset_index(drop=True), cfg.eval_fraction, cfg.seed)  # `meta.row` indexes this
    for batch in pair_batches(df, label_ids, cfg.batch_size, cfg.max_pairs, cfg.lengths):
        held = held_all[batch.meta["row"].to_numpy()]
        tokens = batch.tokens.to(dev)
        for mode in cfg.modes:
            for k, acts in pass_activations(model, tokens, mode).items():
                finals.append(
                    (
                        batch,
                        held,
                        mode,
                        k,
                        {d: r[:, -1].cpu() for d, r in acts["resid"].items()},
                        acts["logits"][:, -1].cpu(),
                    )
                )
                train = np.flatnonzero(~held)
                if len(train) == 0 or cfg.steps == 0:
                    continue
                T = tokens.shape[1]
                pos = torch.randint(0, T, (len(train), cfg.positions), generator=gen)
                pos[:, 0] = T - 1
                rows = torch.as_tensor(train)[:, None].expand_as(pos)
                for d, r in acts["resid"].items():
                    train_x[d].append(r.cpu()[rows, pos].reshape(-1, r.shape[-1]))
                train_y.append(acts["logits"].cpu()[rows, pos].reshape(-1, acts["logits"].shape[-1]))
    if not finals:
        raise FbtError("lens: no samples to run (check --lengths / --tasks)")
    lens, history = None, []
    if cfg.steps > 0 and train_y:
        lens, history = fit_tuned_lens(
            model,
            {d: torch.cat(v).to(dev) for d, v in train_x.items()},
            torch.cat(train_y).to(dev),
            cfg.steps,
            cfg.lr,
            seed=cfg.seed,
        )
    rows = _rows(model, lens, finals)
    summary = summarize_lens(rows, cfg.n_boot, cfg.ci, cfg.seed)
    training = pd.DataFrame({"step": np.arange(1, len(history) + 1), "kl": history})
    return LensResult(rows, summary, training, lens, {"config": asdict(cfg), "metrics": LENS_METRICS})


@torch.no_grad()
def _rows(model, lens, finals) -> pd.DataFrame:
    out = []
    for batch, held, mode, k, resid, final in finals:
        tgt, oth = batch.target.cpu(), batch.other.cpu()
        for d, r in resid.items():
            r = r.to(next(model.parameters()).device)
            kinds = [("logit", logit_lens(model, r))] + ([("tuned", lens(model, r, d))] if lens is not None else [])
            for kind, logits in kinds:
                metrics = _final_metrics(logits.cpu(), final, tgt, oth)
                base = {c: batch.meta[c].to_numpy() for c in batch.meta.columns}
                base.update(mode=mode, pass_index=k, lens=kind, depth=d, eval=held)
                for name, values in metrics.items():
                    out.append(pd.DataFrame({**base, "metric": name, "value": values}))
    return pd.concat(out, ignore_index=True)


SUMMARY_KEYS = ["task", "length_knob", "mode", "pass_index", "lens", "depth", "metric"]
PROPORTIONS = frozenset({"top1"})  # a 0/1 value per sample: Wilson at n = groups


def summarize_lens(rows: pd.DataFrame, n_boot: int = 1000, ci: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Mean and 95 % CI over lens-eval pairs (a pair's value: the mean of its two samples), per
    length knob and pooled over lengths (length_knob = -1). The independent unit is the group (the
    pairs of one group share a context; without `group_id`, the pair): `top1`, a proportion, gets
    the Wilson interval at n = `n_groups`; the continuous metrics (`p_correct`, `logit_diff`,
    `kl_to_final`) the percentile group bootstrap of their mean (docs/statistics.md)."""
    ev = rows[rows["eval"].astype(bool)]
    data = pd.concat([ev, ev.assign(length_knob=-1)], ignore_index=True)
    per_pair = data.groupby(SUMMARY_KEYS + ["pair_id"], sort=True)["value"].mean()
    levels = list(range(len(SUMMARY_KEYS)))
    groups = [(key, v.to_numpy()) for key, v in per_pair.groupby(level=levels, sort=True)]
    labels = None
    if "group_id" in data.columns:
        per_group = data.groupby(SUMMARY_KEYS + ["pair_id"], sort=True)["group_id"].first()
        labels = [g.to_numpy() for _, g in per_group.groupby(level=levels, sort=True)]
    at = SUMMARY_KEYS.index("metric")
    prop = [key[at] in PROPORTIONS for key, _ in groups]
    cont = [i for i, p in enumerate(prop) if not p]
    boot = bootstrap_cis(
        [groups[i][1] for i in cont], n_boot, ci, seed, None if labels is None else [labels[i] for i in cont]
    )
    boot = dict(zip(cont, boot))
    out = []
    for i, (key, v) in enumerate(groups):
        g = None if labels is None else labels[i]
        if prop[i]:
            mean, lo, hi, n_groups = group_proportion(v, g, ci)
        else:
            (mean, lo, hi), n_groups = boot[i], len(v) if g is None else len(set(g))
        out.append(
            {
                **dict(zip(SUMMARY_KEYS, key)),
                "mean": mean,
                "ci_low": lo,
                "ci_high": hi,
                "interval": "wilson" if prop[i] else "group-bootstrap",
                "n_pairs": len(v),
                "n_groups": int(n_groups),
            }
        )
    return pd.DataFrame(out)


def write_lens(
    res: LensResult,
    out_dir,
    df: pd.DataFrame,
    model_info: dict | None = None,
    force: bool = False,
    figures: bool = True,
):
    """OUT/: rows.parquet|csv, lens_summary.parquet|csv, training.parquet|csv, translators.safetensors,
    manifest.json (config, metric definitions, provenance) and figures/lens.png; written atomically."""
    files = []
    with output_dir(Path(out_dir), COMMAND, force=force, kind=LENS_KIND) as tmp:
        for name, table in (("rows", res.rows), ("lens_summary", res.summary), ("training", res.training)):
            table.to_parquet(tmp / f"{name}.parquet", index=False)
            table.to_csv(tmp / f"{name}.csv", index=False)
            files += [f"{name}.parquet", f"{name}.csv"]
        if res.lens is not None:
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in res.lens.state_dict().items()},
                str(tmp / "translators.safetensors"),
            )
            files.append("translators.safetensors")
        if figures:
            (tmp / "figures").mkdir()
            fig = lens_depth(res.summary)
            fig.savefig(tmp / "figures" / "lens.png", dpi=150, bbox_inches="tight")
            files.append("figures/lens.png")
        cfg = res.manifest["config"]
        write_json(
            tmp / "manifest.json",
            {
                "format": FORMAT,
                **res.manifest,
                "files": files,
                "hook_rule": "one-pass (the mode's hooked pass); jacobi:K: serial, every pass",
                "tuned_lens": "one affine translator per depth < L, identity init, KL to the same pass's logits, "
                "fitted on lens-train pairs of every mode and pass; metrics on lens-eval pairs only",
                "provenance": provenance(
                    config=cfg,
                    seed=cfg["seed"],
                    dataset_hash=dataset_hash(df),
                    dataset_files=df.attrs.get("dataset_files", []),
                    **(model_info or {}),
                ),
            },
        )
    return Path(out_dir)
