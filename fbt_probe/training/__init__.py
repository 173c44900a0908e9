"""Multi-pass training of small latent-feedback models (DESIGN.md §3)."""
from __future__ import annotations

import shutil
from pathlib import Path

from fbt_probe.errors import FbtError
from fbt_probe.training.config import PAPER_SCHEDULE, TRAIN_KNOBS, Schedule, TrainConfig, parse_schedule
from fbt_probe.training.loop import multipass_loss, train, weighted_ce

__all__ = ["PAPER_SCHEDULE", "TRAIN_KNOBS", "Schedule", "TrainConfig", "multipass_loss", "parse_schedule",
           "run_training", "train", "weighted_ce"]


def _initial_model(cfg: TrainConfig, tokenizer, init: str | Path | None):
    import fbt_probe as fp

    vocab = tokenizer.get_vocab_size()
    if cfg.arch == "hidden-decoding":  # fresh, or warm-started from a standard checkpoint (fbt_probe.hidden)
        from fbt_probe.hidden.train import initial_model

        model = initial_model(cfg, vocab, init)
        if init is None:
            return model
    elif init is None:
        return fp.load_model(cfg.preset, seed=cfg.seed, d_vocab=vocab, feedback_noise=cfg.noise)
    else:
        model = fp.load_model(str(init))
    if model.cfg.d_vocab != vocab:
        raise FbtError(f"{init}: model vocabulary is {model.cfg.d_vocab} tokens but the task tokenizer has {vocab}")
    init_tok = Path(init) / "tokenizer.json"
    if init_tok.is_file():
        from fbt_probe.tasks import load_tokenizer

        if load_tokenizer(init_tok).get_vocab() != tokenizer.get_vocab():
            raise FbtError(f"{init_tok}: tokenizer does not match the task tokenizer")
    model.cfg = model.cfg.replace(feedback_noise=cfg.noise)
    return model


def run_training(cfg: TrainConfig, out: str | Path, init: str | Path | None = None, resume: bool = False,
                 force: bool = False, progress: bool = True, eval_pairs: int = 16) -> dict:
    """Train (or resume) a run folder. Returns {'seconds', 'tokens', 'step'}."""
    from fbt_probe.tasks import build_tokenizer, load_tokenizer, save_tokenizer
    from fbt_probe.training.checkpoint import load_run, truncate_metrics
    from fbt_probe.training.evaluate import answer_accuracy, eval_samples, loss_per_pass
    from fbt_probe.training.loop import make_optimizer

    out = Path(out)
    if resume:
        if not (out / "config.json").is_file():
            raise FbtError(f"{out}: no run to resume (config.json missing)")
        model, saved, opt_state, step = load_run(out)
        if cfg.steps > saved.steps:
            saved = TrainConfig.from_dict({**saved.to_dict(), "steps": cfg.steps})
        cfg, tokenizer = saved, load_tokenizer(out / "tokenizer.json")
        opt = make_optimizer(model, cfg)
        opt.load_state_dict(opt_state)
        truncate_metrics(out, step)
    else:
        if out.exists() and any(out.iterdir()):
            if not force:
                raise FbtError(f"{out}: already exists; refusing to overwrite (pass --resume to continue it or --force to replace it)")
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        tokenizer = build_tokenizer()
        model = _initial_model(cfg, tokenizer, init)
        save_tokenizer(tokenizer, out / "tokenizer.json")
        opt, step = make_optimizer(model, cfg), 0
    samples = eval_samples(cfg, tokenizer, pairs=eval_pairs)

    def on_eval(m) -> dict:
        acc = answer_accuracy(m, samples, tokenizer, modes=("standard",))
        rec = {f"acc_{r.task}_{r.length_knob}": r.accuracy for r in acc.itertuples()}
        if cfg.arch == "hidden-decoding":
            from fbt_probe.hidden.train import val_loss

            rec.update(val_loss(m, cfg, tokenizer))
        else:
            rec.update(loss_per_pass(m, cfg, tokenizer, max_passes=min(3, cfg.schedule_obj.max_passes + 1)))
        return rec

    result = train(model, tokenizer, cfg, out, start_step=step, optimizer=opt, progress=progress, on_eval=on_eval)
    return {**result, "step": cfg.steps}
