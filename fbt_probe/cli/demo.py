"""`fbt-probe demo`: the built-in default job (what `make demo` runs)."""

from __future__ import annotations

from typing import Annotated

import torch
import typer

from fbt_probe.cli.model.info import model_summary
from fbt_probe.loading import load_model
from fbt_probe.surface.decoding import generate


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        seed: Annotated[int, typer.Option(help="Seed of the random tiny model.")] = 0,
        prompt_len: Annotated[int, typer.Option(help="Tokens in the random prompt.")] = 12,
        new_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 8,
    ) -> None:
        """Build the `tiny` model, summarise its hooks, and greedy-generate under Std / Soft / Fused.

        Example: fbt-probe demo --seed 1
        """

        model = load_model("tiny", seed=seed).eval()
        s = model_summary(model)
        typer.echo(f"tiny model: {s['parameters']:,} parameters, {s['fusion_parameters_2D2']:,} in the fusion (2·D²)")
        typer.echo(
            f"hook points: {len(s['hook_names'])}; fusion: {', '.join(n for n in s['hook_names'] if n.startswith('fusion.'))}"
        )
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, model.cfg.d_vocab, (1, prompt_len), generator=g)
        typer.echo(f"prompt ids: {prompt[0].tolist()}")
        for mode in ("std", "soft", "fused"):
            typer.echo(f"  {mode:5s} -> {generate(model, prompt, new_tokens, mode)[0].tolist()}")
