"""`fbt-probe lens RUN DATASET --out DIR`: logit lens and tuned lens per depth, prefill mode and Jacobi pass."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from fbt_probe.cli.fromconfig import INTS_OR_ALL
from fbt_probe.cli.options import DeviceOption, NBootOption
from fbt_probe.lens.sweep import COMMAND, LENS_KIND, LensConfig, run_lens, write_lens
from fbt_probe.loading import open_pairs
from fbt_probe.marker import refuse_unowned, writing
from fbt_probe.modes import parse_modes


def lens(
    run: Annotated[
        str, typer.Argument(help="Run / checkpoint folder or a preset name (random init).", show_default=False)
    ],
    dataset: Annotated[
        Path,
        typer.Argument(help="A dataset .parquet (with its .manifest.json) or a folder of them.", show_default=False),
    ],
    out: Annotated[Path, typer.Option("--out", help="Output folder (tables, translators, manifest, figures/).")],
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            "--modes",
            help="Prefill modes, comma-separated; jacobi:K draws one line per pass (min(K, T) passes on T tokens: K > T adds none).",
        ),
    ] = "standard,recurrent:1,full,jacobi:3",
    tasks: Annotated[Optional[str], typer.Option(help="Only these tasks (comma-separated).")] = None,
    lengths: Annotated[Optional[str], typer.Option(help="Length knobs to keep, comma-separated or 'all'.")] = None,
    max_pairs: Annotated[Optional[int], typer.Option(help="Pairs per task x length cell (default all).")] = None,
    steps: Annotated[int, typer.Option(help="Tuned-lens training steps (0 = logit lens only).")] = 300,
    lr: Annotated[float, typer.Option(help="Tuned-lens learning rate (Adam).")] = 1e-3,
    positions: Annotated[int, typer.Option(help="Training positions per lens-train sample.")] = 16,
    eval_fraction: Annotated[
        float, typer.Option(help="Share of pair groups held out of tuned-lens training (all metrics are on them).")
    ] = 0.5,
    batch_size: Annotated[int, typer.Option(help="Samples per forward.")] = 32,
    n_boot: NBootOption = 1000,
    seed: Annotated[int, typer.Option(help="Seed (lens split, training positions, bootstrap; preset init).")] = 0,
    device: DeviceOption = "cpu",
    figures: Annotated[bool, typer.Option(help="Draw figures/lens.png.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing OUT.")] = False,
) -> None:
    """What each depth would predict: the logit lens (final norm + tied unembedding) and a tuned lens
    (one affine translator per depth, identity init, KL to the final logits of held-out task text),
    at the final position, under each prefill mode and each Jacobi pass.

    Writes rows.parquet|csv, lens_summary.parquet|csv (mean and 95 % CI over held-out pairs, docs/statistics.md),
    training.parquet|csv, translators.safetensors, manifest.json and figures/lens.png.

    \b
    Example: fbt-probe lens runs/tiny data/tasks --mode standard,recurrent:1,full,jacobi:3 --out results/lens
    """

    cfg = LensConfig(
        modes=tuple(parse_modes(mode)),
        steps=steps,
        lr=lr,
        positions=positions,
        eval_fraction=eval_fraction,
        max_pairs=max_pairs,
        lengths=INTS_OR_ALL.parse(lengths, "--lengths"),
        batch_size=batch_size,
        n_boot=n_boot,
        seed=seed,
    )
    with writing(out, COMMAND):  # one writer of OUT from its check to the swap
        keep = refuse_unowned(out, COMMAND, force, LENS_KIND)  # before loading anything
        lm, df = open_pairs(
            run,
            dataset,
            [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
            device=device,
            seed=seed,
            command="lens",
        )
        model = lm.model
        res = run_lens(model, df, cfg)
        write_lens(res, out, df, lm.provenance(), force=force, figures=figures)
    _report(res, model.cfg.n_layers, out, keep)


def _report(res, top: int, out: Path, keep: list[str] | None) -> None:
    """P(correct) at depth 0 and the top depth per mode and pass, the tuned lens's training, what OUT replaced."""
    s = res.summary
    for r in s[(s.metric == "p_correct") & (s.length_knob == -1) & s.depth.isin([0, top])].itertuples():
        typer.echo(
            f"{r.mode:<12} pass {r.pass_index} {r.task:<11} {r.lens:<6} depth {r.depth}: P(correct) {r.mean:.3f} "
            f"[{r.ci_low:.3f}, {r.ci_high:.3f}] over {r.n_pairs} pairs"
        )
    if len(res.training):
        typer.echo(
            f"tuned lens: KL {res.training['kl'].iloc[0]:.4f} -> {res.training['kl'].iloc[-1]:.4f} nats over {len(res.training)} steps"
        )
    if keep is not None:
        kept = f" (kept {len(keep)} file(s) it had not written: {', '.join(keep[:3])})" if keep else ""
        typer.echo(f"replaced the earlier lens results in {out}{kept}")
    typer.echo(f"wrote {out}")


def register(app: typer.Typer) -> None:
    app.command("lens")(lens)
