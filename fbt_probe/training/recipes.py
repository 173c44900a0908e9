"""Named training recipes: a set of `TrainConfig` fields under one name (`fbt-probe train --recipe NAME`).

`reference` is how the shipped reference models (ref:tiny-feedback, ref:tiny-baseline) are trained
and what `fbt-probe reproduce --train` retrains: an induction warm-up on copy documents (500 steps),
the register tasks alone (1,300 steps), then all four tasks (1,000 steps). The register tasks are
drawn as register documents, half of them with 16-valued registers, four supervised queries each;
the first 300 register steps draw only documents with at most 2 registers and the next 400 at most
4 (a ramp over the register count), then every kind. The loss is on the answers only; the lr is
constant after warm-up until the last 300 steps, which decay it (a cosine to 0.1x): without that
decay 6 cells of 78 fell short of the targets on three seeds, with it none
(docs/research/reference-recipe.md). Without the warm-up no budget we tried bound a value to its
register at all (docs/research/register-binding.md), and with completion and memory beside the
registers from the start it did not form either.
"""

from __future__ import annotations

from fbt_probe.errors import FbtError

# the paper-format register kinds (m:wpr:K:S[:weight]); the same kinds again with 16-valued registers
_REGISTER_KINDS = (
    "2:wpr:1:0 2:wpr:2:0 4:wpr:1:0 4:wpr:2:0 8:wpr:1:0 2:wpr:2:8 4:wpr:2:8 1:16:8 2:16:8 4:16:8 "
    "8:16:8 8:wpr:4:8:0.5 8:wpr:8:8:0.25"
).split()
_MANY_VALUED = [k + ":v16" if k.count(":") == 4 else k + ":1:v16" for k in _REGISTER_KINDS]

RECIPES: dict[str, dict] = {
    "reference": {
        "steps": 2800,
        "copy_steps": 500,
        "register_steps": 1300,
        "register_ramp": "2:300 4:400",
        "tokens_per_step": 4096,
        "task_shares": {"completion": 0.25, "memory": 0.1, "registers": 0.325, "registers-count": 0.325},
        "register_mix": " ".join(_REGISTER_KINDS + _MANY_VALUED),
        "register_queries": 4,
        "answer_share": 1.0,
        "min_lr_ratio": 0.1,
        "decay_steps": 300,
    },
}


def recipe(name: str) -> dict:
    """The `TrainConfig` fields of recipe `name` (a copy)."""
    if name not in RECIPES:
        raise FbtError(f"--recipe {name!r}: no such training recipe (known: {', '.join(sorted(RECIPES))})")
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in RECIPES[name].items()}


def recipe_of(cfg) -> str | None:
    """The name of the recipe `cfg` is, field for field (with its own preset, seed and baseline flag),
    else None: a run that changed any other field is not that recipe."""
    for name, fields in RECIPES.items():
        try:
            ref = type(cfg)(**{**fields, "preset": cfg.preset, "seed": cfg.seed, "baseline": cfg.baseline})
        except FbtError:
            continue
        if _normal(ref) == _normal(cfg):
            return name
    return None


def _normal(cfg) -> dict:
    """`to_dict` with the schedule in one spelling ('paper' and its K:p list are the same schedule)."""
    return {**cfg.to_dict(), "schedule": str(cfg.pass_mix)}
