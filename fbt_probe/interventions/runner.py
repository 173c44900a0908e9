"""Run one experiment over a dataset's minimal pairs and write its tidy tables with provenance.

Output folder `OUT/<experiment>/`: `rows.parquet|csv` (one row per sample of a pair × condition ×
metric), `summary.parquet|csv` (mean and bootstrap CI over pairs per condition × metric; length_knob
-1 = pooled over lengths), `manifest.json` (config, hook rule per experiment, tiny-gap exclusions,
provenance) and `figures/`.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from fbt_probe.errors import FbtError
from fbt_probe.interventions import experiments as E
from fbt_probe.interventions.atp_parity import PARQUET_ONLY, split_rows
from fbt_probe.interventions.metrics import METRIC_HELP, summarize, to_long
from fbt_probe.interventions.pairs import label_token_ids, pair_batches
from fbt_probe.interventions.probe_edits import erase_methods
from fbt_probe.interventions.registry import EXPERIMENTS, HOOK_RULES
from fbt_probe.io import atomic_dir, read_json, write_json
from fbt_probe.model.modes import check_distinct, parse_mode
from fbt_probe.provenance import provenance

FORMAT = "fbt-probe.interventions/1"
RESULTS_KIND = "an interventions results folder (manifest.json of format fbt-probe.interventions/1)"
PREFIX_REUSE = ("positions before the first edited one (T-1; residual: each run's first patched position) "
                "computed once per batch with hooks off, the rest per condition under the same hook rule")


@dataclass(frozen=True)
class PatchConfig:
    """What `run` does: one experiment of the registry, its modes, cells and options (validated here,
    so a bad value is a one-line error before any model runs).

    Each experiment reads the fields named by its options dataclass
    (`fbt_probe.interventions.registry`); the others are ignored. Every field is recorded in the
    manifest's provenance.

    Parameters
    ----------
    experiment : str
        A key of `registry.EXPERIMENTS`: feedback-swap, state-replacement, gate-ablation, residual,
        probe-direction, attribution or das.
    modes : tuple of str, default ("recurrent:1",)
        Prefill modes, each run separately (docs/modes.md).
    batch_size, min_gap, n_boot, ci, seed, max_pairs, lengths, depths, last_k, scales, n_folds, erase,
    decoding, check, hooks, ks, steps, lr, prefix_reuse
        As documented on each field below.

    Examples
    --------
    >>> cfg = PatchConfig("residual", modes=("standard", "recurrent:1"), depths=(0, 2), last_k=4)
    >>> cfg.experiment, cfg.depths, cfg.n_boot
    ('residual', (0, 2), 1000)
    >>> PatchConfig("swap")
    Traceback (most recent call last):
    ...
    fbt_probe.errors.FbtError: experiment 'swap': expected one of feedback-swap, state-replacement, gate-ablation, residual, probe-direction, attribution, das
    """
    experiment: str
    """A key of `registry.EXPERIMENTS`."""
    modes: tuple[str, ...] = ("recurrent:1",)
    """Prefill modes, each run separately."""
    batch_size: int = 32
    """Samples per forward (both samples of a pair always share a batch)."""
    min_gap: float = 0.1
    """|clean - corrupt| logit difference below which a pair is left out of `normalized`."""
    n_boot: int = 1000
    """Bootstrap resamples over pairs."""
    ci: float = 0.95
    """Confidence level of the bootstrap intervals."""
    seed: int = 0
    """Seed of the bootstrap, donors, random states and folds."""
    max_pairs: int | None = None
    """Pairs per task × length cell (None = all; residual defaults to 16)."""
    lengths: tuple[int, ...] | None = None
    """Length knobs to keep (None = all; residual defaults to the shortest of each task)."""
    depths: tuple[int, ...] | None = None
    """Probe depths for residual / probe-direction (None = 0..L)."""
    last_k: int | None = None
    """Residual: patch only the last k positions (None = all)."""
    scales: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    """Probe-direction: steering scales, in class-mean gaps."""
    n_folds: int = 4
    """Probe-direction and DAS: grouped folds."""
    erase: str = "auto"
    """Probe-direction erasure: auto (LEACE and orth), leace, orth or leace,orth."""
    decoding: bool = True
    """Gate ablation: also Std / Soft decoding answer accuracy."""
    check: int = 0
    """Attribution: exact patching on the K cells AtP ranks highest plus K random cells (0 = no check)."""
    hooks: tuple[str, ...] | None = None
    """Attribution / DAS: hook names (None = each experiment's default set)."""
    ks: tuple[int, ...] = (1, 2, 4, 8)
    """DAS: subspace dimensions."""
    steps: int = 200
    """DAS: optimizer steps per rotation."""
    lr: float = 1e-2
    """DAS: Adam learning rate of the rotation."""
    prefix_reuse: bool = True
    """Compute the positions before the first edited one once per batch (hooks off) and run only the
    rest per condition (`fbt_probe.model.prefix`); False re-runs the whole sequence each time (the
    reference path: same tables up to float rounding)."""

    def __post_init__(self) -> None:
        if self.experiment not in EXPERIMENTS:
            raise FbtError(f"experiment '{self.experiment}': expected one of {', '.join(EXPERIMENTS)}")
        check_distinct([str(parse_mode(m)) for m in self.modes], list(self.modes))
        if not (_number(self.min_gap) and self.min_gap >= 0):  # NaN would disable the filter
            raise FbtError(f"--min-gap {self.min_gap}: expected a finite number >= 0")
        if not (_number(self.ci) and 0 < self.ci < 1):
            raise FbtError(f"ci {self.ci}: expected a number in (0, 1)")
        for name, low in (("n_boot", 1), ("batch_size", 2), ("n_folds", 2), ("max_pairs", 1), ("last_k", 1),
                          ("check", 0), ("steps", 1)):
            value = getattr(self, name)
            if value is None and name in ("max_pairs", "last_k"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise FbtError(f"--{name.replace('_', '-').replace('n-folds', 'folds')} {value}: expected an integer >= {low}")
        if self.depths is not None and (not self.depths or min(self.depths) < 0):
            raise FbtError(f"--depths {','.join(map(str, self.depths))}: expected probe depths >= 0 (0 = the model's input)")
        if not all(_number(s) for s in self.scales):
            raise FbtError(f"--scales {self.scales}: expected finite numbers")
        if self.experiment == "probe-direction":
            erase_methods(self.erase)
        if not (_number(self.lr) and self.lr > 0):
            raise FbtError(f"--lr {self.lr}: expected a finite number > 0")
        if not self.ks or min(self.ks) < 1 or len(set(self.ks)) != len(self.ks):
            raise FbtError(f"--ks {','.join(map(str, self.ks))}: expected distinct subspace dimensions >= 1")
        if self.hooks is not None and len(set(self.hooks)) != len(self.hooks):
            raise FbtError(f"--hooks {','.join(self.hooks)}: expected distinct hook names")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _cell_filter(df: pd.DataFrame, cfg: PatchConfig):
    """(lengths, max_pairs) after the residual defaults (shortest knob per task, 16 pairs)."""
    lengths, max_pairs = cfg.lengths, cfg.max_pairs
    if EXPERIMENTS[cfg.experiment].default_cells:
        if lengths is None:
            lengths = tuple(sorted(set(int(k) for k in df.groupby("task")["length_knob"].min())))
        if max_pairs is None:
            max_pairs = 16
    return lengths, max_pairs


def run_experiment(model, df: pd.DataFrame, cfg: PatchConfig, label_ids: dict | None = None) -> pd.DataFrame:
    """All modes of one experiment -> wide rows (df.attrs['notes'] lists skipped cells)."""
    if df.empty:
        raise FbtError("dataset: no rows; nothing to patch")
    label_ids = label_ids or label_token_ids(df)
    E.check_depths(cfg.depths, model)
    lengths, max_pairs = _cell_filter(df, cfg)
    model.eval()
    out, notes, tables = [], [], {}
    for mode in cfg.modes:
        batches = list(pair_batches(df, label_ids, cfg.batch_size, max_pairs, lengths))
        w = EXPERIMENTS[cfg.experiment](model, batches, cfg, mode)
        notes += [f"{mode}: {n}" for n in w.attrs.get("notes", [])]
        for name, t in w.attrs.pop("tables", {}).items():  # DataFrames in attrs would break pd.concat
            tables.setdefault(name, []).append(t)
        out.append(w)
    wide = pd.concat(out, ignore_index=True)
    if wide.empty:  # every cell skipped: say why instead of failing in the summary
        raise FbtError(f"{cfg.experiment}: no cell could run ({'; '.join(notes[:2]) or 'no pairs'})")
    wide.attrs["notes"] = notes
    wide.attrs["tables"] = {k: pd.concat(v, ignore_index=True) for k, v in tables.items()}
    return wide


@dataclass
class Results:
    rows: pd.DataFrame  # long
    summary: pd.DataFrame
    manifest: dict = field(default_factory=dict)
    out_dir: Path | None = None
    tables: dict = field(default_factory=dict)  # experiment-specific tables (attribution: parity; das: das_folds)


def analyse(wide: pd.DataFrame, cfg: PatchConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    if "tables" in wide.attrs:  # DataFrames in attrs break pd.concat's attrs comparison
        wide = wide.copy(deep=False)
        wide.attrs = {k: v for k, v in wide.attrs.items() if k != "tables"}
    long = to_long(wide)
    return long, summarize(long, cfg.n_boot, cfg.ci, cfg.seed)


def exclusions(long: pd.DataFrame) -> dict:
    """Tiny-gap pairs per mode (left out of every normalized figure)."""
    sub = long[long["tiny_gap"].astype(bool)]
    total = long.groupby("mode")[["task", "pair_id"]].apply(lambda g: len(g.drop_duplicates()))
    excl = sub.groupby("mode")[["task", "pair_id"]].apply(lambda g: len(g.drop_duplicates()))
    return {m: {"pairs": int(total[m]), "excluded": int(excl.get(m, 0))} for m in total.index}


def dataset_hash(df: pd.DataFrame) -> str:
    shas = df.attrs.get("dataset_sha256")
    if shas:
        return hashlib.sha256("".join(shas).encode()).hexdigest()
    blob = json.dumps([list(map(int, t)) for t in df["token_ids"]] + df["label"].astype(int).tolist())
    return hashlib.sha256(blob.encode()).hexdigest()


def manifest_for(cfg: PatchConfig, long: pd.DataFrame, notes: list[str], model_info: dict, df: pd.DataFrame) -> dict:
    extra = {}
    if cfg.experiment == "probe-direction":
        methods = erase_methods(cfg.erase)
        extra["erase_methods"] = {"leace": _leace_version() if "leace" in methods else None,
                                  "orth": "orthogonal projection off the probe direction (around the training mean)"}
    return {
        "format": FORMAT, "experiment": cfg.experiment, "modes": list(cfg.modes),
        "hook_rule": HOOK_RULES[cfg.experiment], "metrics": METRIC_HELP,
        "prefix_reuse": PREFIX_REUSE if cfg.prefix_reuse else "off: every condition re-runs the whole sequence",
        "normalized": "(patched - corrupt) / (clean - corrupt); denoising: 1 = full recovery; "
                      "noising / ablation: 1 = no effect, 0 = behaves like the partner",
        "tiny_gap": {"min_gap": cfg.min_gap, "by_mode": exclusions(long)},
        "notes": notes, "files": ["rows.parquet", "rows.csv", "summary.parquet", "summary.csv"], **extra,
        "provenance": provenance(config=asdict(cfg), seed=cfg.seed, dataset_hash=dataset_hash(df),
                                 dataset_files=df.attrs.get("dataset_files", []), **model_info),
    }


def _leace_version() -> str:
    from importlib import metadata

    return f"LEACE via EleutherAI concept-erasure {metadata.version('concept-erasure')}"


def is_results_folder(path: Path) -> bool:
    """A folder written by `write_results` (its manifest has our format)."""
    try:
        meta = read_json(Path(path) / "manifest.json")
    except FbtError:
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


def write_results(res: Results, out_dir: Path, force: bool = False, figures: bool = True) -> Path:
    with atomic_dir(out_dir, force=force, own=is_results_folder, kind=RESULTS_KIND) as tmp:
        for name, table in (("rows", res.rows), ("summary", res.summary), *res.tables.items()):
            table.to_parquet(tmp / f"{name}.parquet", index=False)
            if name not in PARQUET_ONLY:
                table.to_csv(tmp / f"{name}.csv", index=False)
        if figures:
            from fbt_probe.figures.interventions import draw_for

            res.manifest["figures"] = [p.name for p in draw_for(res.summary, tmp / "figures")]
        write_json(tmp / "manifest.json", res.manifest)
    res.out_dir = Path(out_dir)
    return res.out_dir


def run(model, df: pd.DataFrame, cfg: PatchConfig, out: str | Path | None = None, force: bool = False,
        model_info: dict | None = None, label_ids: dict | None = None, figures: bool = True) -> Results:
    """Run `cfg.experiment`, summarize, and (with `out`) write `out/<experiment>/`."""
    target = Path(out) / cfg.experiment if out is not None else None
    if target is not None:  # before hours of patching
        from fbt_probe.io import refuse_existing

        refuse_existing(target, force, own=is_results_folder, kind=RESULTS_KIND)
    wide = run_experiment(model, df, cfg, label_ids)
    tables = wide.attrs.pop("tables", {})
    long, summary = analyse(wide, cfg)
    manifest = manifest_for(cfg, long, wide.attrs.get("notes", []), model_info or {}, df)
    if cfg.experiment == "attribution":  # rows.*: the checked cells; atp_rows.parquet: the whole map
        long, tables = split_rows(long, tables)
    res = Results(long, summary, manifest, tables=tables)
    res.manifest["files"] += [f"{n}.{ext}" for n in tables for ext in ("parquet", "csv") if ext == "parquet" or n not in PARQUET_ONLY]
    if target is not None:
        write_results(res, target, force, figures)
    return res
