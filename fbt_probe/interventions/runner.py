"""Run one experiment over a dataset's minimal pairs and write its tidy tables with provenance.

Output folder `OUT/<experiment>/`: `rows.parquet|csv` (one row per sample of a pair × condition ×
metric), `summary.parquet|csv` (mean and 95 % CI per condition × metric, `metrics.summarize`; length_knob
-1 = pooled over lengths), `manifest.json` (config, hook rule per experiment, tiny-gap exclusions,
provenance) and `figures/`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import pandas as pd

from fbt_probe import distributed
from fbt_probe.errors import FbtError
from fbt_probe.figures.interventions import draw_for
from fbt_probe.interventions.atp_parity import PARQUET_ONLY, split_rows
from fbt_probe.interventions.experiments import check_depths
from fbt_probe.interventions.metrics import METRIC_HELP, summarize, to_long
from fbt_probe.interventions.pairs import label_token_ids, pair_batches
from fbt_probe.interventions.probe_edits import erase_methods
from fbt_probe.interventions.registry import EXPERIMENTS, HOOK_RULES, PatchConfig
from fbt_probe.io import write_csv, write_json
from fbt_probe.marker import output_dir, refuse_unowned
from fbt_probe.modes import Mode
from fbt_probe.provenance import provenance

FORMAT = "fbt-probe.interventions/1"
COMMAND = "patch"  # the output marker's command
RESULTS_KIND = "an interventions results folder written by fbt-probe patch"
PREFIX_REUSE = (
    "positions before the first edited one (T-1; residual: each run's first patched position) "
    "computed once per batch with hooks off, the rest per condition under the same hook rule"
)


def _cell_filter(df: pd.DataFrame, cfg: PatchConfig):
    """(lengths, max_pairs) after the residual defaults (shortest knob per task, 16 pairs)."""
    lengths, max_pairs = cfg.lengths, cfg.max_pairs
    if EXPERIMENTS[cfg.experiment].default_cells:
        if lengths is None:
            lengths = tuple(sorted(set(int(k) for k in df.groupby("task")["length_knob"].min())))
        if max_pairs is None:
            max_pairs = 16
    return lengths, max_pairs


def _shared_out(model, batches: list, cfg: PatchConfig, mode: Mode) -> pd.DataFrame | None:
    """One mode's wide rows. Under torchrun a `per_batch` experiment runs each rank's batches
    (`distributed.assign` by pairs x tokens) and rank 0 puts them back in batch order (the same rows
    as one process: each batch runs whole, on the same shapes); the others return None."""
    exp, world = EXPERIMENTS[cfg.experiment], distributed.world()
    if not (world.several and exp.per_batch):
        return exp(model, batches, cfg, mode)
    owner = distributed.assign([float(b.n * b.T) for b in batches], world.size)
    mine, error = [], None
    try:
        mine = [(i, exp(model, [b], cfg, mode)) for i, b in enumerate(batches) if owner[i] == world.rank]
    except FbtError as exc:
        error = exc.format_message()
    distributed.all_ok(error)
    parts = distributed.gather(mine)
    if not world.main:
        return None
    ordered = sorted((p for rank_parts in parts for p in rank_parts), key=lambda p: p[0])
    if not ordered:
        return exp(model, batches, cfg, mode)  # no batch: the experiment's own answer for none
    w = pd.concat([p[1] for p in ordered], ignore_index=True)
    w.attrs["notes"] = list(dict.fromkeys(n for _, p in ordered for n in p.attrs.get("notes", [])))
    return w


def run_experiment(model, df: pd.DataFrame, cfg: PatchConfig, label_ids: dict | None = None) -> pd.DataFrame | None:
    """All modes of one experiment -> wide rows (df.attrs['notes'] lists skipped cells). Under
    torchrun: on rank 0, the gathered rows (None on the other ranks; `_shared_out`)."""
    if df.empty:
        raise FbtError("dataset: no rows; nothing to patch")
    label_ids = label_ids or label_token_ids(df)
    check_depths(cfg.depths, model)
    lengths, max_pairs = _cell_filter(df, cfg)
    model.eval()
    out = []
    for mode in cfg.modes:
        batches = list(pair_batches(df, label_ids, cfg.batch_size, max_pairs, lengths))
        w = _shared_out(model, batches, cfg, mode)
        if w is not None:  # None: another rank's rows, gathered on rank 0
            out.append((mode, w))
    if not distributed.world().main:
        return None
    return assemble(cfg.experiment, out)


def assemble(experiment: str, parts: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """[(mode, that mode's wide rows)] -> one experiment's wide rows, notes prefixed by their mode
    and extra tables concatenated (in attrs)."""
    notes, tables = [], {}
    for mode, w in parts:
        notes += [f"{mode}: {n}" for n in w.attrs.get("notes", [])]
        for name, t in w.attrs.pop("tables", {}).items():  # DataFrames in attrs would break pd.concat
            tables.setdefault(name, []).append(t)
    wide = pd.concat([w for _, w in parts], ignore_index=True)
    if wide.empty:  # every cell skipped: say why instead of failing in the summary
        raise FbtError(f"{experiment}: no cell could run ({'; '.join(notes[:2]) or 'no pairs'})")
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
    return long, summarize(long, cfg.n_boot, cfg.ci, cfg.seed, min_gap=cfg.min_gap)


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
        methods = erase_methods(cfg.options.erase)
        extra["erase_methods"] = {
            "leace": _leace_version() if "leace" in methods else None,
            "orth": "orthogonal projection off the probe direction (around the training mean)",
        }
    return {
        "format": FORMAT,
        "experiment": cfg.experiment,
        "modes": list(cfg.modes),
        "hook_rule": HOOK_RULES[cfg.experiment],
        "metrics": METRIC_HELP,
        "prefix_reuse": PREFIX_REUSE if cfg.prefix_reuse else "off: every condition re-runs the whole sequence",
        "normalized": "(patched - corrupt) / (clean - corrupt); denoising: 1 = full recovery; "
        "noising / ablation: 1 = no effect, 0 = behaves like the partner",
        "tiny_gap": {"min_gap": cfg.min_gap, "by_mode": exclusions(long)},
        "notes": notes,
        "files": ["rows.parquet", "rows.csv", "summary.parquet", "summary.csv"],
        **extra,
        "provenance": provenance(
            config=asdict(cfg),
            seed=cfg.seed,
            dataset_hash=dataset_hash(df),
            dataset_files=df.attrs.get("dataset_files", []),
            **model_info,
        ),
    }


def _leace_version() -> str:
    return f"LEACE via EleutherAI concept-erasure {metadata.version('concept-erasure')}"


def write_results(res: Results, out_dir: Path, force: bool = False, figures: bool = True) -> Path:
    with output_dir(out_dir, COMMAND, force=force, kind=RESULTS_KIND) as tmp:
        for name, table in (("rows", res.rows), ("summary", res.summary), *res.tables.items()):
            table.to_parquet(tmp / f"{name}.parquet", index=False)
            if name not in PARQUET_ONLY:
                write_csv(table, tmp / f"{name}.csv")
        if figures:
            res.manifest["figures"] = [p.name for p in draw_for(res.summary, tmp / "figures")]
        write_json(tmp / "manifest.json", res.manifest)
    res.out_dir = Path(out_dir)
    return res.out_dir


def run(
    model,
    df: pd.DataFrame,
    cfg: PatchConfig,
    out: str | Path | None = None,
    force: bool = False,
    model_info: dict | None = None,
    label_ids: dict | None = None,
    figures: bool = True,
) -> Results:
    """Run `cfg.experiment`, summarize, and (with `out`) write `out/<experiment>/`. Under torchrun the
    ranks share a `per_batch` experiment's batches, rank 0 alone runs any other, summarizes and
    writes; the other ranks return None."""
    target = Path(out) / cfg.experiment if out is not None else None
    if target is not None:  # before hours of patching
        distributed.on_main(lambda: refuse_unowned(target, COMMAND, force, RESULTS_KIND))
    world = distributed.world()
    if world.several and not EXPERIMENTS[cfg.experiment].per_batch and not world.main:
        return None  # its rows depend on every pair: rank 0 computes it whole (Experiment.per_batch)
    wide = run_experiment(model, df, cfg, label_ids)
    if wide is None:
        return None
    res = results_of(wide, cfg, df, model_info)
    if target is not None:
        write_results(res, target, force, figures)
    return res


def results_of(wide: pd.DataFrame, cfg: PatchConfig, df: pd.DataFrame, model_info: dict | None = None) -> Results:
    """The wide rows of every mode of one experiment -> long rows, summary, manifest and tables."""
    tables = wide.attrs.pop("tables", {})
    long, summary = analyse(wide, cfg)
    manifest = manifest_for(cfg, long, wide.attrs.get("notes", []), model_info or {}, df)
    if cfg.experiment == "attribution":  # rows.*: the checked cells; atp_rows.parquet: the whole map
        long, tables = split_rows(long, tables)
    res = Results(long, summary, manifest, tables=tables)
    res.manifest["files"] += [
        f"{n}.{ext}" for n in tables for ext in ("parquet", "csv") if ext == "parquet" or n not in PARQUET_ONLY
    ]
    return res
