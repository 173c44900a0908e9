"""Make a shipped reference model (`fbt_probe.reference`) from a finished training run: copy its checkpoint, evaluate it on
contexts held out of training, write the model card and the hash record (`fbt-probe model pack`)."""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path

import pandas as pd
import torch

from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import checkpoint_hash
from fbt_probe.io import read_json, sha256_file, write_json
from fbt_probe.marker import output_dir, refuse_unowned, writing
from fbt_probe.provenance import provenance
from fbt_probe.reference import FILES, RECORD, ROOT, is_reference
from fbt_probe.tasks import load_tokenizer
from fbt_probe.training.arch import ARCHS
from fbt_probe.training.checkpoint import load_run, load_trained
from fbt_probe.training.config import TRAIN_KNOBS, TrainConfig
from fbt_probe.training.evaluate import EVAL_MODES, answer_accuracy, contraction, eval_samples, task_config
from fbt_probe.training.lm import corpus_of, heldout_windows
from fbt_probe.training.recipes import recipe_of

COMMAND, KIND = "model pack", "a reference model folder written by fbt-probe model pack"
CHECK_PAIRS = 4  # pairs per task x length cell of the check slice the tests recompute
CHECK_SEED = 10_000  # eval_samples' default seed: contexts held out of training


def check_slice(model, cfg, tok) -> pd.DataFrame:
    """Held-out answer accuracy under standard prefill on the small check slice (task x length)."""
    samples = eval_samples(task_config(cfg), tok, pairs=CHECK_PAIRS, seed=CHECK_SEED)
    acc = answer_accuracy(model, samples, tok, modes=("standard",))
    return acc[["task", "length_knob", "correct", "n"]]


def lm_record(model, cfg: TrainConfig, tok, run: Path) -> dict:
    """A corpus run's record: the corpus it trained on (pins, sha256) and its held-out loss after each
    of 1..4 passes over every held-out file's first window (the corpus must be at `cfg.corpus`)."""
    corpus = corpus_of(cfg)
    tokens, targets, _ = heldout_windows(cfg)
    table = contraction(model, tokens, targets, torch.ones(tokens.shape), n_passes=4)
    return {
        "pins": corpus.record["pins"],
        "corpus_sha256": corpus.sha256,
        "heldout_files": int(tokens.shape[0]),
        "heldout_loss": {int(r["pass"]): round(float(r["val_loss"]), 6) for _, r in table.iterrows()},
    }


def cpu_name() -> str:
    """The CPU model (Linux /proc/cpuinfo) and its core count: training time means something only with it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def retrain_command(cfg, name: str) -> str:
    """The `fbt-probe train` line that retrains the run from scratch (hidden-decoding: from its init)."""
    if ARCHS[cfg.arch].needs_init:
        raise FbtError("a Hidden Decoding run records no --init: pass --command (the line that trained it)")
    named = recipe_of(cfg) if cfg.init is None else None
    if cfg.corpus is not None:  # the run from scratch: a fork of a one-pass run gives the same bytes
        parts = [
            "fbt-probe train",
            f"--preset {cfg.preset}",
            f"--corpus {cfg.corpus}",
            f"--tokens-per-step {cfg.tokens_per_step}",
            f"--seq-len {cfg.seq_len}",
            f"--steps {cfg.steps}",
            f"--lr {cfg.lr:g}",
            f"--seed {cfg.seed}",
        ]
        if not cfg.baseline:
            parts += [f"--schedule {cfg.pass_mix}", f"--one-pass-steps {cfg.one_pass_steps}"]
    elif named is not None:  # the recipe holds the steps and the rest
        parts = ["fbt-probe train", f"--recipe {named}", f"--preset {cfg.preset}", f"--seed {cfg.seed}"]
    elif cfg.init is not None or cfg.register_mix is not None:
        raise FbtError(
            "a run started from --init or trained on --register-mix has no one-line retrain command: "
            "pass --command (the lines that trained it and its init)"
        )
    else:
        parts = ["fbt-probe train", f"--preset {cfg.preset}", f"--steps {cfg.steps}", f"--seed {cfg.seed}"]
    if cfg.baseline:
        parts.append("--baseline")
    return " ".join(parts + [f"--out runs/{name}"])


def pack(
    run: str | Path,
    name: str,
    out_root: str | Path = ROOT,
    eval_pairs: int = 16,
    force: bool = False,
    command: str | None = None,
    timing: str | None = None,
    note: str | None = None,
) -> Path:
    for option, text in (("--note", note), ("--timing", timing), ("--command", command)):
        if text is not None:
            check_note(text, option)
    dest = Path(out_root) / name
    with writing(dest, COMMAND):  # one writer from the check of the folder to the swap
        refuse_unowned(dest, COMMAND, force, KIND, legacy=_is_packed)  # before minutes of evaluation
        return _pack(run, name, dest, eval_pairs, force, command, timing, note)


def check_note(note: str, option: str = "--note") -> str:
    """A card's note is one line of text (printed in bold before the card's numbers): a line break or
    another control character would end the bold run and start Markdown of its own."""
    bad = next((c for c in note if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise FbtError(
            f"{option}: expected one line of text (it is printed in bold before the card's numbers), got the "
            f"control character {bad!r} at position {note.index(bad)}"
        )
    return note


MARKDOWN_SPECIAL = "\\`*_[]<>#|~"


def md_text(text: str) -> str:
    """`text` as literal Markdown: every character Markdown would read as markup escaped."""
    return "".join("\\" + c if c in MARKDOWN_SPECIAL else c for c in text)


def _is_packed(folder: Path) -> bool:
    """A folder that looks like a reference model (before markers: its reference.json)."""
    return (Path(folder) / RECORD).is_file()


def _pack(run, name: str, dest: Path, eval_pairs: int, force: bool, command, timing, note) -> Path:
    prior = None
    if is_reference(str(run)):  # re-evaluate a shipped model (after an evaluation change): its training record stays
        model, cfg, run = load_trained(str(run))  # verifies every shipped file's sha256
        prior = read_json(run / RECORD, f"reference record of {run.name}")
        step = prior["steps"]
    else:
        run = Path(run)
        model, cfg, _, step = load_run(run)  # verifies the run (config, weights, tokenizer, train state)
    tok = load_tokenizer(run / "tokenizer.json")
    command = command or (prior["command"] if prior else retrain_command(cfg, name))
    modes = ARCHS[cfg.arch].eval_modes or EVAL_MODES
    acc = answer_accuracy(model, eval_samples(task_config(cfg), tok, pairs=eval_pairs), tok, modes=modes)
    check = check_slice(model, cfg, tok)
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]
    seconds = sum(m.get("step_s", 0.0) for m in metrics)
    rec = {
        "name": name,
        "arch": cfg.arch,
        "baseline": cfg.baseline,
        "seed": cfg.seed,
        "steps": step,
        "train": cfg.to_dict(),
        "train_seconds": round(seconds, 1),
        "checkpoint_sha256": checkpoint_hash(run),
        "command": command,
        "cpu": prior["cpu"] if prior else cpu_name(),  # the machine it was trained on
        "knobs": {task: list((cfg.knobs or TRAIN_KNOBS)[task]) for task in task_config(cfg).tasks},
        "check": {"pairs": CHECK_PAIRS, "seed": CHECK_SEED, "mode": "standard", "rows": check.to_dict("records")},
        "accuracy": {
            "pairs": eval_pairs,
            "rows": acc[["task", "length_knob", "mode", "correct", "n", "accuracy"]]
            .assign(**({"choice_accuracy": acc["choice_accuracy"]} if cfg.corpus is not None else {}))
            .to_dict("records"),
        },
        "provenance": provenance(seed=cfg.seed),
    }
    timing = timing if timing is not None else (prior or {}).get("timing")
    if (
        timing is not None
    ):  # how long the recipe takes alone, as measured (the summed step times are not, beside other runs)
        rec["timing"] = timing
    if cfg.corpus is not None:
        rec["corpus"] = (
            (prior or {}).get("corpus") if prior and not Path(cfg.corpus).is_dir() else lm_record(model, cfg, tok, run)
        )
    note = note if note is not None else (prior or {}).get("note")
    if note:  # what the card must say before its numbers (a model shipped as a negative result, say)
        rec["note"] = note
    with output_dir(dest, COMMAND, force, KIND, legacy=_is_packed) as tmp:
        for f in ("config.json", "model.safetensors", "tokenizer.json", "metrics.jsonl"):
            shutil.copyfile(run / f, tmp / f)
        (tmp / "card.md").write_text(card(rec, acc))
        rec["sha256"] = {f: sha256_file(tmp / f) for f in FILES}
        write_json(tmp / RECORD, rec)
    return dest


def card(rec: dict, acc: pd.DataFrame) -> str:
    t = rec["train"]
    arch = ARCHS[rec["arch"]]
    kind = arch.kind or ("no-feedback baseline (one pass, fusion unused)" if rec["baseline"] else "latent feedback")
    table = acc.pivot_table(index=["task", "length_knob"], columns="mode", values="accuracy").round(3)
    if t.get("corpus") is not None:  # in context: the two-way choice between the label words beside the top-1 answer
        choice = acc[acc["mode"] == "standard"].set_index(["task", "length_knob"])["choice_accuracy"].round(3)
        return lm_card(rec, table.assign(**{"choice (standard)": choice}))
    lines = [
        f"# ref:{rec['name']}",
        "",
        f"A {t['preset']} model, {kind}, trained {'from the checkpoint named in the retrain command' if arch.needs_init or t.get('init') else 'from scratch'} "
        f"on the task mix below ({rec['steps']} steps, seed {rec['seed']}, "
        f"{rec['train_seconds'] / 60:.1f} min of optimizer steps on {rec['cpu']}, summed from its metrics).",
        "",
        *([f"Training time alone: {rec['timing']}", ""] if rec.get("timing") else []),
        *([f"**{md_text(rec['note'])}**", ""] if rec.get("note") else []),
        f"- checkpoint sha256: `{rec['checkpoint_sha256']}`",
        f"- tasks and training lengths: {json.dumps(rec['knobs'])}; token shares {json.dumps(t['task_shares'])}",
        f"- schedule {t['schedule']!r}, lr {t['lr']} ({_lr_schedule(t)}), tokens/step {t['tokens_per_step']}, seed {rec['seed']}",
        f"- retrain: `{rec['command']}`",
        f"- commit {rec['provenance']['git_commit']}, torch {rec['provenance']['versions'].get('torch')}",
        "",
        f"## Held-out answer accuracy ({rec['accuracy']['pairs']} minimal pairs per task x length, contexts held out of training)",
        "",
        _md(table.reset_index()),
        "",
        "Chance is 0.5 everywhere (the two samples of a pair have opposite answers).",
        "",
    ]
    return "\n".join(lines)


def _lr_schedule(t: dict) -> str:
    """The lr schedule of a run's train config, in words (`fbt_probe.training.loop.lr_at`)."""
    cfg = TrainConfig.from_dict(t, "reference record's train config")
    warm, floor = cfg.warmup, cfg.min_lr_ratio
    if floor == 1:
        return f"constant after a {warm}-step warm-up"
    if cfg.decay_start > warm:  # a decay that starts at the warm-up's end is the plain cosine
        return f"constant after a {warm}-step warm-up, then a cosine to {floor:g}x over the last {cfg.steps - cfg.decay_start} steps"
    return f"a cosine to {floor:g}x after a {warm}-step warm-up"


def _md(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    rows = ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + rows)


def lm_card(rec: dict, table: pd.DataFrame) -> str:
    """The card of a general language model (a corpus run): what it was trained on, how, and what it
    reads; the task table is in-context accuracy, the tasks never trained on."""
    t, c = TrainConfig.from_dict(rec["train"], "reference record's train config"), rec["corpus"]
    kind = (
        "no-feedback baseline (one pass every step)" if rec["baseline"] else f"latent feedback, schedule {t.schedule!r}"
    )
    pins = "; ".join(
        f"{a['package']}=={a['version']} ({a['file']}, sha256 {a['sha256'][:12]}...)" for a in c["pins"]["archives"]
    )
    loss = " | ".join(f"{c['heldout_loss'][k]:.3f}" for k in sorted(c["heldout_loss"], key=int))
    lines = [
        f"# ref:{rec['name']}",
        "",
        f"A general language model ({t.preset} preset, {kind}), trained from scratch by next-token prediction on "
        f"the corpus {c['pins']['name']} ({rec['steps']} steps of {t.tokens_per_step} tokens in windows of "
        f"{t.seq_len}, seed {rec['seed']}, {rec['train_seconds'] / 60:.1f} min of optimizer steps on {rec['cpu']}, "
        "summed from its metrics). It never trained on the appendix-F tasks; the study reads them in context.",
        "",
        *([f"Training time alone: {rec['timing']}", ""] if rec.get("timing") else []),
        *([f"**{rec['note']}**", ""] if rec.get("note") else []),
        f"- checkpoint sha256: `{rec['checkpoint_sha256']}`",
        f"- corpus: {pins}; the built corpus's sha256 `{c['corpus_sha256']}` (fbt-probe corpus fetch && fbt-probe corpus build)",
        f"- lr {t.lr:g} ({_lr_schedule(rec['train'])}), one-pass steps {t.one_pass_steps}, noise {t.noise}, seed {rec['seed']}",
        *(
            [
                f"- its first steps were trained once, in `{t.fork}` (checkpoint sha256 `{t.fork_sha256}`), and forked: the same bytes as the retrain line's run from scratch"
            ]
            if t.fork
            else []
        ),
        f"- retrain: `{rec['command']}`",
        f"- commit {rec['provenance']['git_commit']}, torch {rec['provenance']['versions'].get('torch')}",
        "",
        f"## Held-out loss (the first {t.seq_len} tokens of each of {c['heldout_files']} held-out files)",
        "",
        "| passes | " + " | ".join(str(k) for k in sorted(c["heldout_loss"], key=int)) + " |",
        "|---|" + "---|" * len(c["heldout_loss"]),
        f"| loss (nats per token) | {loss} |",
        "",
        "Pass 1 is standard prefill; pass k has k − 1 feedback passes (the baseline's go through a fusion it never trained).",
        "",
        f"## In-context answer accuracy ({rec['accuracy']['pairs']} minimal pairs per task x length)",
        "",
        _md(table.reset_index()),
        "",
        "Each mode's column: the top-1 token is the answer word (a general LM may answer with other words: 0.0). "
        "`choice (standard)`: the answer word's logit above the other label word's under standard prefill (chance 0.5).",
        "",
    ]
    return "\n".join(lines)
