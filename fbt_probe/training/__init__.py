"""Multi-pass training of small latent-feedback models (docs/training.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from pathlib import Path

from fbt_probe import distributed
from fbt_probe.errors import FbtError
from fbt_probe.io import read_json, refuse_existing, temp_sibling
from fbt_probe.loading import checkpoint_hash
from fbt_probe.marker import is_marked, list_files, refuse_links, swap_keeping, write_marker, writing
from fbt_probe.model.loss import weighted_ce
from fbt_probe.reference import resolve
from fbt_probe.tasks import build_tokenizer, load_tokenizer, save_tokenizer
from fbt_probe.training.arch import ARCHS
from fbt_probe.training.checkpoint import load_curriculum, load_run, truncate_metrics
from fbt_probe.training.config import PAPER_SCHEDULE, TRAIN_KNOBS, PassMix, TrainConfig, parse_schedule
from fbt_probe.training.curriculum import Progress
from fbt_probe.training.evaluate import answer_accuracy, eval_samples, loss_per_pass
from fbt_probe.training.fork import copy_log, load_fork
from fbt_probe.training.lm import corpus_of
from fbt_probe.training.loop import make_optimizer, train
from fbt_probe.training.objective import multipass_loss
from fbt_probe.training.resume import RUN_FILES, recorded, unfinished_run

__all__ = [
    "PAPER_SCHEDULE",
    "TRAIN_KNOBS",
    "PassMix",
    "TrainConfig",
    "multipass_loss",
    "parse_schedule",
    "run_training",
    "train",
    "weighted_ce",
]


def _initial_model(cfg: TrainConfig, tokenizer, init: str | Path | None):
    init = None if init is None else resolve(str(init))  # ref:<name>: a shipped model, hashes verified
    vocab = tokenizer.get_vocab_size()
    model = ARCHS[cfg.arch].initial_model(cfg, vocab, init)
    if init is None:
        return model
    if model.cfg.d_vocab != vocab:
        raise FbtError(f"{init}: model vocabulary is {model.cfg.d_vocab} tokens but the task tokenizer has {vocab}")
    init_tok = Path(init) / "tokenizer.json"
    if init_tok.is_file():
        if load_tokenizer(init_tok).get_vocab() != tokenizer.get_vocab():
            raise FbtError(f"{init_tok}: tokenizer does not match the task tokenizer")
    model.cfg = model.cfg.replace(feedback_noise=cfg.noise)
    return model


def run_training(
    cfg: TrainConfig,
    out: str | Path,
    init: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    eval_pairs: int = 16,
    fsdp: bool = False,
    device: str = "cpu",
    stop_at: int | None = None,
    fork: str | Path | None = None,
) -> dict:
    """Train (or resume) a run folder. Returns {'seconds', 'tokens', 'step'} (+ 'replaced': the folder
    path when `force` replaced an earlier run). `force` replaces only a run folder (or an empty
    folder), after every input has been read; the new run is trained in a temporary sibling and
    swapped in when it finishes, so an error or an interruption leaves the old run as it was.
    Under torchrun the ranks share every step (DDP; `fsdp`: FSDP2), rank 0 writes the folder.
    `init` (default `cfg.init`): a run folder, checkpoint or ref:<name> whose weights the run starts
    from, with a fresh optimizer; recorded in the run's config as `init` and `init_sha256`.
    `device`: where this process trains (`parallel.process_device` resolves the CLI's --device);
    the checkpoint is written from the CPU whatever it is, so any run resumes on any device.
    `stop_at`: train only to that step (a checkpoint there; `resume` continues the run).
    `fork`: start from that run's checkpoint and optimizer state at step N, a run of this config but
    for its schedule (e.g. the baseline stopped at N), where N <= `one_pass_steps`: its steps are
    then this run's, bit for bit (`fbt_probe.training.fork`); recorded as `fork` and `fork_sha256`.
    The run folder's lock is held from its check to the end (`fbt_probe.marker.writing`): a second
    `train` into the same folder is refused in one line instead of writing beside this one."""
    out = Path(out)
    main = distributed.world().main  # under torchrun, rank 0 alone writes into the run folder
    with contextlib.ExitStack() as held:

        def hold() -> None:  # on rank 0, which alone writes; a refusal reaches every rank
            held.enter_context(writing(out, COMMAND))
            refuse_links(out)  # no checkpoint or log written through a link in the folder

        distributed.on_main(hold)
        return _run_training(cfg, out, init, resume, force, progress, eval_pairs, fsdp, device, stop_at, fork, main)


def _run_training(cfg, out: Path, init, resume, force, progress, eval_pairs, fsdp, device, stop_at, fork, main) -> dict:
    replacing = False
    if resume:
        model, cfg, tokenizer, opt, step = _resumed(out, cfg, device)
    else:
        replacing = distributed.on_main(
            lambda: refuse_existing(
                out,
                force,
                hint="--resume to continue it or --force",
                own=lambda p: is_marked(p, COMMAND) and (is_run_folder(p) or unfinished_run(p)),
                kind="a training run folder written by fbt-probe train (its .fbt-output.json marker, and config.json "
                "with a 'train' field or a run stopped before its first checkpoint)",
            )
        )
        keep = distributed.on_main(lambda: foreign_run_files(out) if replacing else [])
        # every input is read before anything is written
        model, cfg, tokenizer, opt, step = _fresh(cfg, init, fork, device)
        target = out
        out = distributed.on_main(lambda: _start_folder(out, replacing, tokenizer))
        if fork is not None:
            distributed.on_main(lambda: copy_log(Path(fork), out, step))
    if replacing:  # a forced run trains beside the old one and replaces it only when finished
        try:
            result = _train(model, tokenizer, cfg, out, step, opt, progress, eval_pairs, fsdp, stop_at)
            distributed.on_main(lambda: swap_keeping(out, target, keep))
        finally:
            if distributed.world().main and out.exists():  # under torchrun, rank 0 alone writes the folder
                shutil.rmtree(out)
        return {**result, "replaced": str(target)}
    return _train(model, tokenizer, cfg, out, step, opt, progress, eval_pairs, fsdp, stop_at)


def _resumed(out: Path, cfg: TrainConfig, device: str):
    """(model, config, tokenizer, optimizer, step) of the run in `out`, to continue it to `cfg.steps`."""
    recorded(out)  # a folder without a run (or one stopped before its first checkpoint) is refused by name
    model, saved, opt_state, step = load_run(out)
    model = _on_device(model, device)  # before the optimizer: its loaded state follows the parameters
    if cfg.steps > saved.steps:
        saved = TrainConfig.from_dict({**saved.to_dict(), "steps": cfg.steps})
    tokenizer, opt = load_tokenizer(out / "tokenizer.json"), make_optimizer(model, saved)
    try:
        opt.load_state_dict(opt_state)
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError) as exc:
        raise FbtError(
            f"{out / 'train_state.pt'}: optimizer state does not fit the model "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); cannot resume"
        ) from None
    distributed.on_main(lambda: truncate_metrics(out, step))
    return model, saved, tokenizer, opt, step


def _fresh(cfg: TrainConfig, init, fork, device: str):
    """(model, config, tokenizer, optimizer, step) of a new run: initial weights (from `init`), or a
    forked run's weights, optimizer state and step; the config records where they came from."""
    if cfg.corpus is not None:  # the corpus's own tokenizer; the run records which build it read
        corpus = corpus_of(dataclasses.replace(cfg, corpus_sha256=None))
        cfg = dataclasses.replace(cfg, corpus_sha256=corpus.sha256)
        tokenizer = corpus.tokenizer()
    else:
        tokenizer = build_tokenizer()
    init = init if init is not None else cfg.init
    model = _on_device(_initial_model(cfg, tokenizer, init), device)
    if init is not None:
        cfg = dataclasses.replace(cfg, init=str(init), init_sha256=_init_sha256(init))
    if fork is None:
        return model, cfg, tokenizer, make_optimizer(model, cfg), 0
    forked = load_fork(fork, cfg, tokenizer)  # the forked run's weights, optimizer state and log up to its step
    model = _on_device(forked.model, device)
    cfg = dataclasses.replace(cfg, fork=str(fork), fork_sha256=forked.sha256)
    opt = make_optimizer(model, cfg)
    opt.load_state_dict(forked.optimizer)
    return model, cfg, tokenizer, opt, forked.step


def _init_sha256(init) -> str | None:
    """sha256 of the init checkpoint's weights file (a Qwen3-format folder may have none)."""
    folder = Path(resolve(str(init)))
    try:
        return checkpoint_hash(folder)
    except (FbtError, OSError):
        return None


def _on_device(model, device: str):
    model.cfg = model.cfg.replace(device=device)  # what the model's own code reads to place new tensors
    return model.to(device)


def _start_folder(out: Path, replacing: bool, tokenizer) -> Path:
    """The folder the run is written into (beside `out` when it replaces one), with its tokenizer."""
    folder = temp_sibling(out) if replacing else out
    folder.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tokenizer, folder / "tokenizer.json")
    write_marker(folder, COMMAND)  # the folder is a run of ours from its first file on
    return folder


COMMAND = "train"  # the output marker's command


def foreign_run_files(folder: Path) -> list[str]:
    """The files of run folder `folder` that the trainer did not write (a forced run keeps them):
    the trainer rewrites its own files (RUN_FILES) all through a run, so these are named, not hashed."""
    return [rel for rel in list_files(folder) if rel not in RUN_FILES]


def is_run_folder(folder: Path) -> bool:
    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        return False
    try:
        meta = read_json(cfg, "run config")
    except FbtError:
        return False
    return isinstance(meta, dict) and "train" in meta and "fbt_probe_format" in meta


def _train(
    model,
    tokenizer,
    cfg: TrainConfig,
    out: Path,
    step: int,
    opt,
    progress: bool,
    eval_pairs: int,
    fsdp: bool,
    stop_at: int | None = None,
) -> dict:
    if cfg.corpus is not None:
        corpus_of(cfg)  # a resumed run's corpus is checked against its record before the first step

        def on_eval(m) -> dict:
            return loss_per_pass(m, cfg, tokenizer, max_passes=cfg.pass_mix.max_passes + 1, corpus=True)

    else:
        samples = eval_samples(cfg, tokenizer, pairs=eval_pairs)

        def on_eval(m) -> dict:
            acc = answer_accuracy(m, samples, tokenizer, modes=("standard",))
            rec = {f"acc_{r.task}_{r.length_knob}": r.accuracy for r in acc.itertuples()}
            rec.update(ARCHS[cfg.arch].val_losses(m, cfg, tokenizer, max_passes=min(3, cfg.pass_mix.max_passes + 1)))
            return rec

    curriculum = None
    if cfg.k_curriculum is not None:  # a resumed run continues from the advances its train state records
        curriculum = Progress(cfg, tokenizer, load_curriculum(out) if (out / "train_state.pt").is_file() else ())
    result = train(model, tokenizer, cfg, out, step, opt, progress, on_eval, fsdp, stop_at, curriculum)
    return {**result, "step": cfg.steps if stop_at is None else min(stop_at, cfg.steps)}
