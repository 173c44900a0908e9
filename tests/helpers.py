"""Small configs and models for tests (factories, SAELens-style)."""

from __future__ import annotations

import torch

from fbt_probe.config import ModelConfig
from fbt_probe.engine.hooks import hooked, silent
from fbt_probe.engine.schedule import scan_chunks
from fbt_probe.engine.walk import Walk
from fbt_probe.model.transformer import FeedbackTransformer


def make_cfg(**overrides) -> ModelConfig:
    base = dict(
        d_vocab=128,
        d_model=32,
        n_layers=3,
        n_heads=4,
        n_key_value_heads=2,
        d_head=8,
        d_mlp=48,
        n_ctx=128,
        window=5,
        global_every=3,
    )
    base.update(overrides)
    return ModelConfig(**base)


STEP_CONFIGS = {  # the serial-step variants the lean and the static-buffer steps are checked on
    "gqa-window": dict(),  # window 5 bites within T
    "mqa-global": dict(n_heads=4, n_key_value_heads=1, window=None),
    "mha-prenorm-scaled": dict(n_key_value_heads=4, feedback_source="pre_norm", depth_scaling="1/sqrt(2L)"),
}


def make_model(seed: int = 0, dtype=torch.float64, **overrides) -> FeedbackTransformer:
    torch.manual_seed(seed)
    return FeedbackTransformer(make_cfg(**overrides)).to(dtype).eval()


def make_nanochat(seed: int = 0, dtype=torch.float64, **extras):
    """A `NanochatTransformer` on `make_cfg`'s backbone with the given extras (random weights)."""
    from fbt_probe.formats.nanochat.config import NanochatConfig
    from fbt_probe.formats.nanochat.model import NanochatTransformer

    backbone = {k: v for k, v in extras.items() if k in ModelConfig.__dataclass_fields__}
    cfg = NanochatConfig(**make_cfg(**backbone).to_dict() | {k: v for k, v in extras.items() if k not in backbone})
    torch.manual_seed(seed)
    return NanochatTransformer(cfg).to(dtype).eval()


def tokens(batch: int, T: int, vocab: int = 37, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, T), generator=torch.Generator().manual_seed(seed))


def task_pairs(groups: int, tasks=("completion", "memory"), knob: int = 8):
    """(minimal pairs of `tasks` at one length from the built-in tokenizer, that tokenizer)."""
    import dataclasses

    import pandas as pd

    from fbt_probe.tasks import build_tokenizer, generate, load_spec

    tok = build_tokenizer()
    frames = [
        generate(dataclasses.replace(load_spec(t), length_grid=(knob,)), groups=groups, seed=0, tokenizer=tok)
        for t in tasks
    ]
    return pd.concat(frames, ignore_index=True), tok


def assert_same_rows(a, b, rtol: float = 1e-9, atol: float = 1e-10) -> None:
    """Same rows in the same order; float columns equal up to float64 rounding (a real difference in
    what ran, e.g. a wrong prefix, a stale cache position or a hook at the wrong position, moves
    logits at order 1e-3 or more)."""
    import numpy as np

    assert list(a.columns) == list(b.columns) and len(a) == len(b) and len(a) > 0
    for c in a.columns:
        if a[c].dtype.kind == "f":
            np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=rtol, atol=atol, err_msg=c)
        else:
            assert a[c].tolist() == b[c].tolist(), c


def patch_workdir(root):
    """A saved float32 test model (root/run) and completion + memory pairs at lengths 0 and 8
    (root/data): what `fbt-probe patch` reads."""
    import dataclasses

    from fbt_probe.formats.checkpoint import save_checkpoint
    from fbt_probe.tasks import build_tokenizer, generate, load_spec, save_tokenizer, write_dataset

    tok = build_tokenizer()
    for task in ("completion", "memory"):
        df = generate(dataclasses.replace(load_spec(task), length_grid=(0, 8)), groups=3, seed=0, tokenizer=tok)
        write_dataset(df, root / "data", tok)
    save_tokenizer(tok, root / "tokenizer.json")
    save_checkpoint(make_model(dtype=torch.float32), root / "run", tokenizer_path=root / "tokenizer.json")
    return root


def serial_scan(model, x: torch.Tensor, n_serial: int, hooks: bool = False, stop: int | None = None):
    """The serial scan of `x` whose last `n_serial` positions are steps, up to `stop`, walked
    (`fbt_probe.engine.walk`): (cache, the top state of each position, logits, the last top state)."""
    w = Walk(model, x, hooked if hooks else silent).run(scan_chunks(x.shape[1], n_serial, stop))
    return w.caches[0], w.top_states(1), w.logits, w.top[:, -1]
