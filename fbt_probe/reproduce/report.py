"""Figures and the self-contained report (report.md + report.html with embedded PNGs) of a
`reproduce` run. Everything here reads tables written by earlier stages; nothing runs a model."""

from __future__ import annotations

import base64
import functools
import html
import json
from pathlib import Path

import pandas as pd

from fbt_probe.figures import draw_all
from fbt_probe.io import atomic_dir, atomic_path
from fbt_probe.loading import checkpoint_hash
from fbt_probe.provenance import git_commit, provenance
from fbt_probe.reproduce import rules
from fbt_probe.reproduce.config import (
    LM_MODELS,
    depth_name,
    depth_path,
    is_lm,
    shipped_name,
    training_note,
)
from fbt_probe.reproduce.config import tokenizer as study_tokenizer
from fbt_probe.reproduce.part import HEADLINE, MODEL_WORDS, Section, md_table, model_hashes
from fbt_probe.reproduce.parts import PARTS
from fbt_probe.reproduce.seeds import between_seeds_text, is_proportion, spread_table, with_own
from fbt_probe.reproduce.tables import same_kind, setting, study_kind
from fbt_probe.tasks import tokenizer_sha256


def captions() -> dict[str, str]:
    """Every part's figure captions, by figure stem without the model suffix."""
    return {k: v for part in PARTS for k, v in part.captions.items()}


def figure_caption(stem: str) -> str:
    """The report's caption of figure `stem` ("fig7a-feedback" -> the model, then the fig7a caption);
    a stem without a caption in any part is refused, so that no figure goes out captioned by its
    file name."""
    table = captions()
    for key in sorted(table, key=len, reverse=True):
        if stem == key or stem.startswith(key + "-"):
            model = stem[len(key) + 1 :]
            words = MODEL_WORDS.get(model, model)
            lead = f"{words[0].upper()}{words[1:]}. " if words else ""
            return lead + table[key]
    raise ValueError(f"figure {stem}: no caption in any part's captions (say what it shows and how to read it)")


def figure_jobs(cfg, out: Path) -> list:
    """Every part's figure jobs."""
    return [job for part in PARTS for job in part.figures(cfg, out)]


def stage_figures(cfg, out: Path, workers: int = 1) -> None:
    """Every figure of the study into OUT/figures (`workers` processes draw them side by side)."""
    with atomic_dir(out / "figures", force=True) as tmp:
        draw_all(figure_jobs(cfg, out), tmp, formats=cfg.figure_formats(), dpi=150, workers=workers)


def _model_reference(cfg, name: str) -> str:
    """How the study names model `name`: its shipped reference, the user's checkpoint, or the folder
    it was trained in, with the preset."""
    if cfg.model:
        return f"checkpoint {cfg.baseline if name == 'baseline' else cfg.model}"
    if cfg.shipped:
        return f"ref:{shipped_name(cfg, name)} (preset {cfg.preset})"
    return f"trained here: models/{name} (preset {cfg.preset})"


def _provenance(cfg, out: Path, times: dict) -> dict:
    ran = (Path(out) / "results" / "depth").is_dir()  # the serial-depth part's models, where it ran
    depth = {f"depth-{n}": depth_path(cfg, out, n) for n in cfg.depth_models()} if ran else {}
    return provenance(
        config=cfg.to_dict(),
        seed=cfg.seed,
        models={
            **{n: _model_reference(cfg, n) for n in cfg.models()},
            **{n: f"ref:{p.name}" if cfg.shipped else f"trained here: models/{n}" for n, p in depth.items()},
        },
        checkpoints={
            **model_hashes(cfg, out),
            **{n: checkpoint_hash(p) for n, p in depth.items()},
        },
        stage_seconds={k: round(v, 1) for k, v in times.items()},
        **({"tokenizer": _tokenizer_record(cfg)} if cfg.model else {}),
    )


def _checkpoint_source(cfg) -> str:
    """The intro's account of a user checkpoint: it, its tokenizer, and its baseline or the lack of one."""
    tok = _tokenizer_record(cfg)
    text = (
        f"the checkpoint `{cfg.model}`, in its own tokenizer (`{tok['file']}`, {tok['vocab_size']:,} tokens, "
        f"sha256 {tok['sha256'][:12]}...)"
    )
    trained = f" (training: {training_note(cfg)})"
    if cfg.baseline:
        return text + f", beside its no-feedback baseline `{cfg.baseline}`" + trained
    return (
        text
        + trained
        + (
            "; no baseline was given (`--baseline PATH`), so no number here is read beside a model without trained feedback"
        )
    )


def _tokenizer_record(cfg) -> dict:
    """The user checkpoint's tokenizer: its file, sha256 (as dataset manifests record it) and size."""
    tok = study_tokenizer(cfg)
    return {
        "file": str(Path(cfg.model) / "tokenizer.json"),
        "sha256": tokenizer_sha256(tok),
        "vocab_size": tok.get_vocab_size(),
    }


def provenance_rows(record: dict) -> list[tuple[str, str]]:
    """The provenance record's key facts, (what, value), for the report's short table: each model's
    reference and checkpoint sha256, fbt-probe's commit and version, the working directory's commit
    (where recorded), the torch and transformer-lens versions, the seed, the config's settings (its
    scalar fields; the lists and tables of the config are in the full record)."""
    rows = []
    models, sums = record.get("models") or {}, record.get("checkpoints") or {}
    for n in dict.fromkeys([*models, *sums]):
        if n in models:
            rows.append((f"model ({n})", str(models[n])))
        if n in sums:
            rows.append((f"checkpoint sha256 ({n})", str(sums[n])))
    rows.append(("fbt-probe commit", str(record.get("git_commit", "unknown"))))
    pkg = record.get("package") or {}
    if pkg:
        rows.append(("fbt-probe version", f"{pkg.get('version', 'unknown')} ({pkg.get('kind', 'unknown')})"))
    if "working_directory_commit" in record:
        rows.append(("working-directory commit", str(record["working_directory_commit"])))
    versions = record.get("versions") or {}
    for lib in ("torch", "transformer-lens", "python"):
        if lib in versions:
            rows.append((lib, str(versions[lib])))
    if "seed" in record:
        rows.append(("seed", str(record["seed"])))
    cfg = record.get("config") or {}
    scalars = [f"{k}={v}" for k, v in cfg.items() if v is None or isinstance(v, (str, int, float, bool))]
    if scalars:
        rows.append(("config", ", ".join(scalars)))
    return rows


def provenance_markdown(record: dict) -> str:
    """The short provenance table, then the full record as JSON in a collapsed <details> block
    (rendered by GitHub in the Markdown, and by `_md_to_html(..., trusted=True)` in the HTML).
    Cell values are HTML-escaped and their pipes escaped, so a path or a version cannot break the
    table or inject markup."""

    def cell(v: str) -> str:
        return html.escape(v, quote=False).replace("|", "\\|")

    table = ["| what | value |", "|---|---|"] + [f"| {cell(k)} | {cell(v)} |" for k, v in provenance_rows(record)]
    body = json.dumps(record, indent=1, default=str)
    return (
        "\n".join(table) + "\n\n<details>\n<summary>Full provenance record (JSON)</summary>\n\n"
        "```json\n" + body + "\n```\n\n</details>\n"
    )


def seeds_table_text(seeds: pd.DataFrame) -> str:
    """One row per headline number: its value in each seed's study, their mean and range."""
    wide = seeds.pivot_table(index=["model", "quantity", "task", "mode", "study"], columns="seed", values="value")
    wide.columns = [f"seed {c}" for c in wide.columns]
    mean, rng = wide.mean(axis=1), wide.max(axis=1) - wide.min(axis=1)  # over the seeds that have the number
    ci = wide.apply(lambda r: between_seeds_text(r.to_numpy(dtype=float), is_proportion(r.name[1])), axis=1)
    wide = wide.round(3).assign(mean=mean.round(3), range=rng.round(3), **{"between-seed 95 % CI": ci})
    return (
        "Each headline number of the findings in the study of each training seed (the same recipe and study, "
        "seed of data, initialisation and probes changed): how much of a number is the seed. The between-seed "
        "CI is the t interval of the mean over the seeds (n - 1 degrees of freedom; cut to [0, 1] for an accuracy, "
        "not for a normalized effect or a ratio, which can leave it), left empty where the seeds agree (no "
        "zero-width interval).\n\n" + md_table(wide.reset_index())
    )


def sections(cfg, out: Path, times: dict) -> list[Section]:
    """Every part's sections in registry order, then *What was run*."""
    figs = sorted(p.stem for p in (out / "figures").glob("*.png"))
    found = [sec for part in PARTS for sec in part.sections(cfg, out, figs)]
    return found + [Section("What was run", provenance_markdown(_provenance(cfg, out, times)))]


def criteria_line() -> str:
    """How the findings are worded: every part's criteria, each once."""
    names = dict.fromkeys(name for part in PARTS for name in part.criteria)
    return "How the findings are worded: " + "; ".join(rules.CRITERIA[n] for n in names if n in rules.CRITERIA) + "."


def seeds_note(cfg, seeds, other_seeds) -> str:
    """What the findings' numbers are over: one training seed, or the seeds table's seeds."""
    other_kind = other_seeds is not None and len(other_seeds) > 0 and (seeds is None or len(seeds) == 0)
    if seeds is None or seeds["seed"].nunique() < 2:
        return (
            f"Every number is one training seed's ({cfg.seed}); the CIs are within the run (samples or groups), "
            "not over training seeds, and every verdict is that seed's"
            + (
                f" (the seeds table holds {'/'.join(sorted(set(other_seeds['study'])))} studies only, whose numbers "
                f"are not a {study_kind(cfg)} study's)"
                if other_kind
                else ""
            )
            + "."
        )
    n = seeds["seed"].nunique()
    return (
        f"The training seed is the unit: a number in bold is the mean over the {n} training seeds of the seeds "
        f"table ({' / '.join(sorted(set(seeds['study'])))} study of each; data, initialisation and probes "
        "changed) with its between-seed t interval in brackets, then each seed's value and this study's seed "
        f"({cfg.seed}) with its within-run CI; a number the seeds table lacks is said to be one seed's. A verdict "
        "is stated only where each seed's own numbers give it; otherwise the finding says on how many seeds it "
        "holds, with each seed's numbers (table *Over training seeds*)."
    )


def findings(cfg, out: Path, seeds: pd.DataFrame | None = None, own: pd.DataFrame | None = None) -> list[str]:
    """One sentence per finding (Markdown), every part's in registry order, then how they are worded
    and what their numbers are over. Each part reads every seed's numbers from `seeds` (a stacked
    headline table) of this study's kind, this study's seed's rows being its own headline (`own`,
    computed here unless given)."""
    out = Path(out)
    kind = same_kind(seeds, study_kind(cfg))
    own = headline(cfg, out) if own is None else own
    every = with_own(kind, own, cfg.seed)
    lines = [f for part in PARTS for f in part.findings(cfg, out, every)]
    return lines + [criteria_line(), seeds_note(cfg, kind, seeds)]


def headline(cfg, out: Path) -> pd.DataFrame:
    """The numbers the findings quote, one row each (`part.HEADLINE` columns) with the study's seed and
    kind: what `seeds.csv` stacks over training seeds."""
    frames = [t for part in PARTS if len(t := part.headline(cfg, Path(out)))]
    t = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=HEADLINE)
    return t.assign(seed=cfg.seed, study=study_kind(cfg), commit=git_commit())


def _other_models(cfg) -> str:
    """The shipped models a part reads beside the study's two: the serial-depth pair, or an LM
    preset's 75/25 run (the `passes` part's schedule comparison)."""
    if is_lm(cfg):
        extra = [n for n in LM_MODELS if n not in cfg.models()]
        return "".join(f", and for the passes part `ref:{shipped_name(cfg, n)}`" for n in extra)
    if not cfg.depth_models():
        return ""
    return ", and for the serial-depth part " + ", ".join(f"`ref:{depth_name(cfg, n)}`" for n in cfg.depth_models())


def stage_report(cfg, out: Path, times: dict) -> None:
    """Findings first (one sentence each, number, CI, figure), then every figure, then the full tables
    (collapsed in the HTML), then what was run."""
    own = headline(cfg, out)
    with atomic_path(out / "headline.csv") as tmp:  # what a multi-seed run stacks (seeds.csv)
        own.to_csv(tmp, index=False, float_format="%.6g")

    subject = f"checkpoint {Path(cfg.model).name}" if cfg.model else f"preset {cfg.preset}"
    title = f"fbt-probe reproduction — {subject}{' (quick)' if cfg.quick else ' (demo)' if cfg.demo else ''}"
    *tables, prov = sections(cfg, out, times)
    source = (
        (
            "the reference models shipped with the package ("
            + ", ".join(f"`ref:{shipped_name(cfg, n)}`" for n in cfg.models())
            + _other_models(cfg)
            + "); `fbt-probe reproduce --train` retrains them"
        )
        if cfg.shipped
        else (_checkpoint_source(cfg) if cfg.model else "models trained from scratch in this study")
    )
    scope = (
        " The demo study: fewer probe groups, no `full` recurrence on the register tasks, the causal experiments at "
        "one length per task ("
        + ", ".join(f"{t} {','.join(map(str, k))}" for t, k in cfg.patch_knobs.items())
        + "), lighter AtP/DAS/lens, the serial-depth part on a reduced range (k = "
        + ", ".join(map(str, cfg.depth_knobs))
        + f", {cfg.depth_pairs} pairs per k);"
        " `fbt-probe reproduce` without --demo runs the full one."
        if cfg.demo
        else ""
    )
    intro = (
        f"Models: {source}.{scope} {setting(cfg)} Stage times: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
        + "."
    )
    seeds = spread_table(cfg, out)
    found = findings(cfg, out, seeds, own)
    kind = same_kind(seeds, study_kind(cfg))
    if kind is not None and len(kind):
        tables.append(Section("Over training seeds", seeds_table_text(kind)))
    md = [f"# {title}\n", intro + "\n", "## Findings\n", "\n".join(f"- {f}" for f in found) + "\n", "## Figures\n"]
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{_inline(intro)}</p>",
        "<h2>Findings</h2>",
        "<ul>" + "".join(f"<li>{_inline(f)}</li>" for f in found) + "</ul>",
        "<h2>Figures</h2>",
    ]
    for sec in tables:
        head = sec.title
        for f in sec.figures:
            caption = figure_caption(f)
            md.append(f"![{f}](figures/{f}.png)\n\n*{f}* ({head}): {caption}\n")
            data = base64.b64encode((out / "figures" / f"{f}.png").read_bytes()).decode()
            body.append(
                f'<figure><img alt="{f}" src="data:image/png;base64,{data}"><figcaption><i>{html.escape(f)}</i> '
                f"({html.escape(head)}): {html.escape(caption)}</figcaption></figure>"
            )
    md.append("## Tables\n")
    body.append("<h2>Tables</h2>")
    for sec in tables:
        md.append(f"### {sec.title}\n\n{sec.body}")
        body.append(f"<details><summary>{html.escape(sec.title)}</summary>{_md_to_html(sec.body)}</details>")
    md.append(f"## {prov.title}\n\n{prov.body}")
    body.append(f"<h2>{html.escape(prov.title)}</h2>" + _md_to_html(prov.body, trusted=True))
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text("\n".join(md))
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title><style>"
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:11px}"
        "li{margin:.4em 0}details{margin:.6em 0}summary{cursor:pointer;font-weight:bold}"
        "</style></head><body>" + "\n".join(body) + "</body></html>"
    )
    with atomic_path(out / "report.html") as tmp:
        tmp.write_text(page)


@functools.lru_cache(maxsize=2)
def _markdown(trusted: bool = False):
    from markdown_it import MarkdownIt

    # raw HTML in a table cell stays text, except in text this module wrote and escaped itself (`trusted`)
    return MarkdownIt("commonmark", {"html": trusted}).enable("table")


def _inline(text: str) -> str:
    """One finding's Markdown (bold, code, emphasis, links) as inline HTML, everything else escaped."""
    return _markdown().renderInline(text)


def _md_to_html(text: str, trusted: bool = False) -> str:
    """A section's Markdown (pipe tables, fenced code, paragraphs, inline markup) as HTML, by
    markdown-it-py (CommonMark with GFM tables). `trusted`: the text's own HTML blocks (the
    provenance section's <details>) are kept; elsewhere they are shown as text."""
    return _markdown(trusted).render(text)
