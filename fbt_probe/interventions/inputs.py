"""Loading what `fbt-probe patch RUN DATASET` names: the model of a run and a pair dataset."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from fbt_probe.errors import FbtError

CHECKPOINT_SUBDIRS = ("", "checkpoint", "final", "model")


def resolve_checkpoint(run: str | Path) -> Path | None:
    """The checkpoint folder of RUN: RUN itself or RUN/{checkpoint,final,model} holding a config.json."""
    p = Path(run)
    for sub in CHECKPOINT_SUBDIRS:
        cand = p / sub if sub else p
        if (cand / "config.json").is_file():
            return cand
    return None


def load_run_model(run: str | Path, device: str = "cpu", seed: int = 0):
    """(model, info for the provenance record, tokenizer.json path or None).

    RUN is a preset name (random init from `seed`: for tests and smoke runs), a checkpoint folder
    (ours or Qwen3-format) or a run folder holding one (see `resolve_checkpoint`)."""
    import fbt_probe
    from fbt_probe.config import PRESETS

    if str(run) in PRESETS:
        model = fbt_probe.load_model(str(run), device=device, seed=seed)
        return model, {"model_source": f"preset:{run}", "model_seed": seed, "model_config": model.cfg.to_dict()}, None
    folder = resolve_checkpoint(run)
    if folder is None:
        raise FbtError(f"{run}: neither a preset nor a folder with a checkpoint "
                       f"(config.json in it or in {', '.join(s for s in CHECKPOINT_SUBDIRS if s)}/)")
    from fbt_probe.model.checkpoint import checkpoint_hash

    model = fbt_probe.load_model(folder, device=device)
    info = {"model_source": str(folder), "checkpoint_hash": checkpoint_hash(folder), "model_config": model.cfg.to_dict()}
    tok = folder / "tokenizer.json"
    return model, info, tok if tok.is_file() else None


def load_pairs(dataset: str | Path, tasks=None) -> pd.DataFrame:
    """A dataset file (.parquet or its .manifest.json) or a folder of them, as one frame.

    `df.attrs`: label_token_ids {task: (id of label-0 word, id of label-1 word)}, dataset_sha256,
    dataset_files, tokenizer_sha256."""
    from fbt_probe.tasks import load_dataset

    path = Path(dataset)
    files = sorted(path.glob("*.manifest.json")) if path.is_dir() else [path]
    if not files:
        raise FbtError(f"{path}: no dataset (*.parquet with its .manifest.json) in this folder")
    frames, ids, shas, toks = [], {}, [], set()
    for f in files:
        df = load_dataset(f)
        man = df.attrs["manifest"]
        if tasks and man["task"] not in tasks:
            continue
        if df.empty:
            raise FbtError(f"{f}: the dataset has no rows; nothing to patch")
        known = (man.get("tokenizer") or {}).get("label_token_ids") or {}
        words = {int(k): v for k, v in man["spec"]["label_words"].items()}
        if any(known.get(words[c]) is None for c in (0, 1)):
            raise FbtError(f"{f}: label words {words} are not single tokens under the dataset's tokenizer")
        ids[man["task"]] = (int(known[words[0]]), int(known[words[1]]))
        _check_label_ids(f, man, words, ids[man["task"]])
        shas.append(man["sha256"])
        toks.add((man.get("tokenizer") or {}).get("sha256"))
        frames.append(df)
    if not frames:
        raise FbtError(f"{path}: no dataset of task(s) {sorted(tasks)}")
    if len(toks) > 1:
        raise FbtError(f"{path}: its datasets were tokenized with different tokenizers")
    out = pd.concat(frames, ignore_index=True)
    out.attrs = {"label_token_ids": ids, "dataset_sha256": shas, "dataset_files": [str(f) for f in files],
                 "tokenizer_sha256": toks.pop()}
    return out


def _check_label_ids(f: Path, manifest: dict, words: dict, ids: tuple[int, int]) -> None:
    """Refuse label words the dataset's tokenizer maps to its unknown token (datasets written before
    generation refused them): the logit difference would be taken against <unk>."""
    from fbt_probe.tasks.tokenizer import load_tokenizer, unk_id

    tok_file = f.parent / ((manifest.get("tokenizer") or {}).get("file") or "tokenizer.json")
    if ids[0] == ids[1]:
        raise FbtError(f"{f}: label words {words[0]!r} and {words[1]!r} have the same token id {ids[0]}")
    if not tok_file.is_file():
        return
    unk = unk_id(load_tokenizer(tok_file))
    for label, tid in enumerate(ids):
        if unk is not None and tid == unk:
            raise FbtError(f"{f}: label word {words[label]!r} is the unknown token of {tok_file} "
                           "(regenerate the dataset with a tokenizer that has it)")


def check_compatible(model, df: pd.DataFrame, tokenizer_path: Path | None) -> None:
    """Refuse a dataset whose tokens the model cannot read or whose tokenizer differs from the run's."""
    top = max(max(map(int, ids)) for ids in df["token_ids"])
    if top >= model.cfg.d_vocab:
        raise FbtError(f"dataset: token id {top} is outside the model's vocabulary of {model.cfg.d_vocab} "
                       "(dataset and model use different tokenizers)")
    if tokenizer_path is not None and df.attrs.get("tokenizer_sha256"):
        from fbt_probe.tasks import load_tokenizer, tokenizer_sha256

        if tokenizer_sha256(load_tokenizer(tokenizer_path)) != df.attrs["tokenizer_sha256"]:
            raise FbtError(f"{tokenizer_path}: differs from the tokenizer the dataset was made with "
                           "(regenerate the dataset with --tokenizer pointing at it)")
