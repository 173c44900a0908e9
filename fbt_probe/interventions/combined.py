"""Several experiments in one command (`fbt-probe patch --experiment a,b,...`), sharing the prefill.

Feedback swap, state replacement, gate ablation and probe-direction all edit the final position
only, on the same pair batches, so each needs the same prefix of each batch (positions < T - 1 under
the mode). Run as separate commands they compute it five times over the dataset (state replacement
twice: all carried states are needed before any donor can be swapped in). Here the batches are cut
into units (`units`: contiguous, each probe-direction cell inside one), and per unit one prefix per
batch serves all of them (one `Forwards` holding the unit's prefixes), state replacement's first pass
included; its second pass runs after every unit, as on its own. Residual patching (its own default cells), attribution and
DAS (no prefix reuse) run after, each as on its own.

The tables are those of the separate commands (tests/test_combined.py): every experiment still
sees every batch in order, its statistics over all pairs (mean gates, donors, means) are computed
over all batches, and a shared prefix equals a fresh one.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from fbt_probe import distributed
from fbt_probe.errors import FbtError
from fbt_probe.interventions import experiments as E
from fbt_probe.interventions.forwards import Forwards
from fbt_probe.interventions.pairs import label_token_ids, pair_batches
from fbt_probe.interventions.registry import EXPERIMENTS, PatchConfig
from fbt_probe.interventions.runner import (
    COMMAND,
    RESULTS_KIND,
    Results,
    assemble,
    results_of,
    run,
    run_experiment,
    write_results,
)
from fbt_probe.marker import refuse_unowned
from fbt_probe.modes import Mode

SHARED = ("state-replacement", "feedback-swap", "gate-ablation", "probe-direction")  # final position, same batches


def units(batches) -> list[range]:
    """Contiguous ranges of batch indices, each holding whole probe-direction cells (task × length
    knob of a batch's first row, `probe_edits.probe_direction`), as short as that allows."""
    key = [(str(b.meta["task"].iloc[0]), int(b.meta["length_knob"].iloc[0])) for b in batches]
    last = {k: i for i, k in enumerate(key)}
    out, start, end = [], 0, -1
    for i, k in enumerate(key):
        end = max(end, last[k])
        if i == end:
            out.append(range(start, i + 1))
            start = i + 1
    return out


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    w = pd.concat(parts, ignore_index=True)
    w.attrs = {"notes": [n for p in parts for n in p.attrs.get("notes", [])]}
    return w


def _one_mode(fw: Forwards, by: dict, batches: list, mode: Mode) -> dict[str, pd.DataFrame]:
    """{experiment: wide rows of `mode`} for the SHARED experiments in `by`, through one `Forwards`."""
    means = E.mean_gates(fw.model, batches) if "gate-ablation" in by else None  # over every batch, as on its own
    parts = {name: [] for name in by}
    states, metas = [], []
    for unit in units(batches):
        part = [batches[i] for i in unit]
        with fw.holding():  # this unit's prefixes, freed when it ends
            if "state-replacement" in by:  # the first pass: carried states into the final position
                s, m = E.carried_last_states(fw, part, mode)
                states.append(s)
                metas.append(m)
            for name in ("feedback-swap", "gate-ablation", "probe-direction"):
                if name in by:
                    extra = {"means": means} if name == "gate-ablation" else {}
                    parts[name].append(EXPERIMENTS[name](fw, part, by[name], mode, **extra))
    if "state-replacement" in by:
        carried = (torch.cat(states), pd.concat(metas, ignore_index=True))
        parts["state-replacement"].append(
            EXPERIMENTS["state-replacement"](fw, batches, by["state-replacement"], mode, carried=carried)
        )
    return {name: _concat(p) for name, p in parts.items()}


def run_shared(
    model, df: pd.DataFrame, cfgs: list[PatchConfig], label_ids: dict | None = None
) -> dict[str, pd.DataFrame]:
    """{experiment: wide rows} of SHARED experiments that agree on cells and batch size. Each mode
    runs the experiments that have it, together; an experiment's modes keep their own order."""
    first = cfgs[0]
    for cfg in cfgs:
        if cfg.experiment not in SHARED:
            raise ValueError(f"{cfg.experiment}: not an experiment that shares the final-position prefix")
        if (cfg.lengths, cfg.max_pairs, cfg.batch_size) != (first.lengths, first.max_pairs, first.batch_size):
            raise ValueError("experiments run together need the same lengths, max_pairs and batch_size")
        E.check_depths(cfg.depths, model)
    if df.empty:
        raise FbtError("dataset: no rows; nothing to patch")
    label_ids = label_ids or label_token_ids(df)
    model.eval()
    dev = E.device_of(model)
    fw = Forwards(model)  # prefix reuse on: `run_several` sends only those here
    parts = {cfg.experiment: {} for cfg in cfgs}
    for mode in dict.fromkeys(m for cfg in cfgs for m in cfg.modes):
        by = {cfg.experiment: cfg for cfg in cfgs if mode in cfg.modes}
        # moved once, so every experiment meets the same token tensors (the runner's key)
        batches = [b.to(dev) for b in pair_batches(df, label_ids, first.batch_size, first.max_pairs, first.lengths)]
        for name, w in _one_mode(fw, by, batches, mode).items():
            parts[name][mode] = w
    return {
        cfg.experiment: assemble(cfg.experiment, [(m, parts[cfg.experiment][m]) for m in cfg.modes]) for cfg in cfgs
    }


def run_several(
    model,
    df: pd.DataFrame,
    cfgs: list[PatchConfig],
    out: str | Path | None = None,
    force: bool = False,
    model_info: dict | None = None,
    label_ids: dict | None = None,
    figures: bool = True,
) -> list[Results] | None:
    """Each experiment of `cfgs` (in order), as `runner.run` would, writing `out/<experiment>/`; the
    SHARED ones (two or more, with prefix reuse) in one pass over the batches. Everything is
    computed before anything is written. Under torchrun each runs on its own (`runner.run`)."""
    names = [c.experiment for c in cfgs]
    if len(set(names)) != len(names):
        raise FbtError(f"--experiment {','.join(names)}: each experiment at most once")
    if distributed.world().several:
        done = [run(model, df, cfg, out, force, model_info, label_ids, figures) for cfg in cfgs]
        return None if any(r is None for r in done) else done
    if out is not None:  # before any patching
        for name in names:
            refuse_unowned(Path(out) / name, COMMAND, force, RESULTS_KIND)
    together = [c for c in cfgs if c.experiment in SHARED and c.prefix_reuse]
    wide = run_shared(model, df, together, label_ids) if len(together) > 1 else {}
    for cfg in cfgs:
        if cfg.experiment not in wide:
            wide[cfg.experiment] = run_experiment(model, df, cfg, label_ids)
    results = [results_of(wide[cfg.experiment], cfg, df, model_info) for cfg in cfgs]
    if out is not None:
        for res, cfg in zip(results, cfgs):
            write_results(res, Path(out) / cfg.experiment, force, figures)
    return results
