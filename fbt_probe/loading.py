"""Reading what a command names: a model, a dataset, and whether the two fit together.

Every command and library entry point loads through here, so a model has one meaning everywhere:

- `load_model(source)`: a preset, `ref:<name>` (a shipped reference model), a checkpoint folder of
  ours (the kind is read from its config.json through `CHECKPOINT_LOADERS`) or a Qwen3-format folder.
- `open_model(source)`: the same, plus a run folder holding a checkpoint, and what results record
  about it (`LoadedModel.hash`, `.provenance()`, the tokenizer beside the checkpoint).
- `load_data(dataset)`: a dataset file, a folder of them or a DataFrame, as one frame with its
  hashes in `df.attrs`.
- `check_compatible(model, df, tokenizer)`: columns, lengths, token ids and tokenizer, checked
  before anything runs.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from fbt_probe.config import PRESETS, arch_of, check_device, preset
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import FORMATS, load_checkpoint
from fbt_probe.formats.checkpoint import checkpoint_hash as safetensors_hash
from fbt_probe.formats.nanochat.checkpoint import is_nanochat_folder, load_imported, load_nanochat, pt_sha256
from fbt_probe.formats.nanochat.config import ARCH as NANOCHAT_ARCH
from fbt_probe.formats.nanochat.config import is_nanochat_record
from fbt_probe.formats.qwen3 import import_qwen3
from fbt_probe.hidden.checkpoint import load_hidden
from fbt_probe.hidden.config import ARCH as HIDDEN_ARCH
from fbt_probe.io import read_json
from fbt_probe.model.transformer import FeedbackTransformer
from fbt_probe.reference import is_reference, resolve
from fbt_probe.tasks import SAMPLE_COLUMNS, check_tokenizer_fits, load_dataset, load_tokenizer, tokenizer_sha256
from fbt_probe.tasks.tokenizer import encode, unk_id

__all__ = [
    "CHECKPOINT_LOADERS",
    "CHECKPOINT_SUBDIRS",
    "FOREIGN_LOADERS",
    "LoadedModel",
    "check_compatible",
    "checkpoint_hash",
    "checkpoint_kind",
    "load_data",
    "load_model",
    "load_pairs",
    "open_model",
    "open_pairs",
    "resolve_checkpoint",
    "state_hash",
]

CHECKPOINT_SUBDIRS = ("", "checkpoint", "final", "model")

# config.json's `model.arch` -> the loader of that kind of checkpoint (folder, device) -> model in eval mode
CHECKPOINT_LOADERS: dict[str, Callable] = {
    "feedback": load_checkpoint,
    HIDDEN_ARCH: load_hidden,
    NANOCHAT_ARCH: load_imported,
}
# folders that are not ours, tried in order: (recognises the folder, loads it (folder, device, seed) in
# eval mode); a folder none of them recognises is read as Qwen3 format. One place to add a kind.
FOREIGN_LOADERS: list[tuple[Callable[[Path], bool], Callable[..., torch.nn.Module]]] = [
    (is_nanochat_folder, lambda folder, device, seed: load_nanochat(folder, device=device, seed=seed).eval()),
]


def checkpoint_kind(folder: str | Path) -> str | None:
    """The `model.arch` of a checkpoint folder of ours ('feedback' when absent), None for any other folder."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    meta = read_json(path, "checkpoint config")
    if not isinstance(meta, dict) or meta.get("fbt_probe_format") not in FORMATS:
        return None
    model = meta.get("model")
    if not isinstance(model, dict):
        return "feedback"
    return NANOCHAT_ARCH if is_nanochat_record(model) else model.get("arch", "feedback")


def load_model(source: str | Path, device: str = "cpu", seed: int = 0, **overrides):
    """Load a model by name or folder, in eval mode.

    Parameters
    ----------
    source : str or Path
        A preset name (``tiny``, ``paper-1b``, ...: random weights from `seed`), ``ref:<name>`` (a
        reference model shipped with the package, see ``fbt-probe model refs``), a checkpoint folder
        of ours (latent-feedback or Hidden Decoding), a nanochat latent-feedback checkpoint folder
        (``model_<step>.pt`` + ``meta_<step>.json``, the last step; see
        `fbt_probe.formats.nanochat`) or a Qwen3-format folder (config.json and safetensors;
        fresh fusion weights are added from `seed`).
    device : str, default "cpu"
        Where the weights go.
    seed : int, default 0
        Initialisation seed of a preset (and of the fusion weights added to a Qwen3 folder).
    **overrides
        Config fields of a preset (e.g. ``n_layers=2``). Folders carry their own config, so
        overrides apply to presets only.

    Returns
    -------
    torch.nn.Module
        A `FeedbackTransformer` (or a `HiddenDecodingTransformer` for such a checkpoint) in eval
        mode: no training noise on the carried states. Training calls ``.train()`` itself.

    Examples
    --------
    >>> import torch
    >>> import fbt_probe as fp
    >>> model = fp.load_model("tiny", n_layers=2)
    >>> model.cfg.n_layers, model.training
    (2, False)
    >>> model(torch.tensor([[1, 2, 3]])).shape[:2]
    torch.Size([1, 3])
    """
    check_device(device)
    source = resolve(source)  # ref:<name> (also as a Path): a shipped reference model, hashes verified
    if isinstance(source, os.PathLike) and str(source) in PRESETS and not Path(source).exists():
        source = str(source)  # Path("tiny"): the preset, as no such folder exists
    if isinstance(source, str) and source in PRESETS:
        cfg = preset(source, device=device, **overrides)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return FeedbackTransformer(cfg).to(device).eval()
    folder = Path(source)
    if not folder.is_dir():
        raise FbtError(f"{source}: neither a preset ({', '.join(sorted(PRESETS))}) nor a model folder")
    if overrides:
        raise FbtError(
            f"{source}: config overrides ({', '.join(sorted(overrides))}) apply to presets only; "
            "a folder carries its own config"
        )
    return _with_default_mode(_with_tokenizer(_load_folder(folder, device, seed), folder), folder)


def _load_folder(folder: Path, device: str, seed: int):
    kind = checkpoint_kind(folder)
    if kind is None:  # not ours: another kind we import, else a Qwen3-format folder
        for recognises, load in FOREIGN_LOADERS:
            if recognises(folder):
                return load(folder, device, seed)
        return import_qwen3(folder, seed=seed).to(device).eval()
    if kind not in CHECKPOINT_LOADERS:
        raise FbtError(
            f"{folder / 'config.json'}: field 'model.arch': expected one of {sorted(CHECKPOINT_LOADERS)}, got {kind!r}"
        )
    return CHECKPOINT_LOADERS[kind](folder, device=device)


TRAINED_FEEDBACK_MODE = "recurrent:1"
"""The default mode of a checkpoint trained with feedback: the paper's recurrent prefill step, so that
the first call a TransformerLens user writes (`model(tokens)`, `run_with_cache`, `patching`)
includes the feedback path (docs/modes.md)."""


def _with_default_mode(model, folder: Path):
    """`model.default_mode`: `recurrent:1` where the folder's training record says the fusion was
    trained (`train.baseline` false), else `standard` (baselines, imports without a record)."""
    if not hasattr(model, "default_mode"):
        return model
    try:
        train = json.loads((folder / "config.json").read_text()).get("train")
    except (OSError, ValueError, AttributeError):
        train = None
    if isinstance(train, dict) and train.get("baseline") is False and train.get("arch", "feedback") == "feedback":
        model.default_mode = TRAINED_FEEDBACK_MODE
    return model


def _with_tokenizer(model, folder: Path):
    """`model.tokenizer` (what `to_tokens`, `to_str_tokens` and `generate` read): the folder's
    tokenizer.json, where it has one: every id it can produce must have a row of the embedding (its
    largest id and its BOS / EOS, not its id count), so that no text it encodes indexes past it."""
    if (folder / "tokenizer.json").is_file():
        model.tokenizer = load_tokenizer(folder)
        rows = getattr(getattr(model, "cfg", None), "d_vocab", None)
        if rows is not None:
            check_tokenizer_fits(model.tokenizer, rows, str(folder / "tokenizer.json"))
    return model


def resolve_checkpoint(run: str | Path) -> Path | None:
    """The checkpoint folder of RUN: RUN itself or RUN/{checkpoint,final,model} holding a config.json,
    or RUN itself when it is a nanochat checkpoint folder (model_<step>.pt + meta_<step>.json)."""
    p = Path(run)
    if is_nanochat_folder(p):
        return p
    for sub in CHECKPOINT_SUBDIRS:
        cand = p / sub if sub else p
        if (cand / "config.json").is_file():
            return cand
    return None


def checkpoint_hash(folder: str | Path) -> str:
    """The sha256 results record for a checkpoint folder: its model.safetensors, or the last
    model_<step>.pt of a nanochat folder."""
    return (
        pt_sha256(Path(folder))
        if is_nanochat_folder(Path(folder)) and not (Path(folder) / "model.safetensors").is_file()
        else safetensors_hash(folder)
    )


def state_hash(model) -> str:
    """sha256 over parameter names, shapes, dtypes and bytes (identity of a model without a file)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@dataclass
class LoadedModel:
    """A model with what results record about where it came from.

    Attributes
    ----------
    model : torch.nn.Module
        The model, in eval mode when it was loaded here.
    source : str
        What the caller named (a preset, ``ref:<name>``, a folder) or the class name of an object.
    folder : Path or None
        The checkpoint folder (None for a preset or an object).
    seed : int
        Initialisation seed of a preset.
    """

    model: torch.nn.Module
    source: str
    folder: Path | None = None
    seed: int = 0
    preset: bool = field(default=False, repr=False)

    @property
    def tokenizer(self) -> Path | None:
        """The checkpoint's tokenizer.json, when it has one."""
        tok = None if self.folder is None else self.folder / "tokenizer.json"
        return tok if tok is not None and tok.is_file() else None

    @cached_property
    def hash(self) -> str:
        """The model identity in activation manifests: the checkpoint's sha256, else a hash of its weights."""
        if self.folder is not None and (
            (self.folder / "model.safetensors").is_file() or is_nanochat_folder(self.folder)
        ):
            return checkpoint_hash(self.folder)
        if self.preset:
            return f"preset:{self.source}:{state_hash(self.model)}"
        return state_hash(self.model)

    def provenance(self) -> dict:
        """What intervention results record: model_source, model_seed or checkpoint_hash, model_config."""
        cfg = self.model.cfg.to_dict()
        if self.preset:
            return {"model_source": f"preset:{self.source}", "model_seed": self.seed, "model_config": cfg}
        if self.folder is None:
            return {"model_source": self.source, "model_hash": self.hash, "model_config": cfg}
        src = self.source if is_reference(self.source) else str(self.folder)
        return {"model_source": src, "checkpoint_hash": self.hash, "model_config": cfg}


def open_model(source, device: str | None = None, seed: int = 0) -> LoadedModel:
    """A `LoadedModel` from a model object, a preset, ``ref:<name>``, a checkpoint folder or a run
    folder holding one (RUN/{checkpoint,final,model}/config.json). An object is moved to `device`
    when one is given; everything else is loaded on `device` (default cpu)."""
    if not isinstance(source, (str, Path)):
        return LoadedModel(source if device is None else source.to(device), type(source).__name__)
    name = str(source)
    if name in PRESETS:
        return LoadedModel(load_model(name, device=device or "cpu", seed=seed), name, seed=seed, preset=True)
    folder = resolve_checkpoint(resolve(name))  # ref:<name> -> its verified folder; `name` stays for provenance
    if folder is None:
        raise FbtError(
            f"{source}: neither a preset ({', '.join(sorted(PRESETS))}) nor a folder with a checkpoint "
            f"(config.json in it or in {', '.join(s for s in CHECKPOINT_SUBDIRS if s)}/)"
        )
    return LoadedModel(load_model(folder, device=device or "cpu", seed=seed), name, folder, seed)


# ----------------------------------------------------------------------------- datasets
def _frame_hash(df: pd.DataFrame) -> str:
    blob = json.dumps(
        {
            c: df[c].map(lambda v: list(map(int, v)) if c == "token_ids" else v).tolist()
            for c in ("token_ids",) + SAMPLE_COLUMNS
        },
        default=str,
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def load_data(dataset, tasks=None, *, pairs: bool = False, command: str = "patch") -> pd.DataFrame:
    """A dataset file (.parquet or its .manifest.json), a folder of them or a DataFrame, as one frame.

    `tasks` keeps only those tasks' files. With `pairs` (the intervention commands) every file must
    have rows (`command` names the command in the refusal) and two distinct single-token label words, recorded in ``attrs["label_token_ids"]``
    {task: (id of the label-0 word, id of the label-1 word)}. ``df.attrs`` also holds
    ``dataset_hash`` (the provenance hash), ``dataset_files``, ``dataset_sha256`` (per kept file)
    and ``tokenizer_sha256`` (None when the manifests do not say).
    """
    if isinstance(dataset, pd.DataFrame):
        df = dataset.reset_index(drop=True)
        missing = {"token_ids", *SAMPLE_COLUMNS} - set(df.columns)
        if missing:
            raise FbtError(f"<DataFrame>: dataset lacks column(s) {sorted(missing)}")
        tok = (df.attrs.get("manifest") or {}).get("tokenizer", {}).get("sha256")
        df.attrs = {
            **df.attrs,
            "dataset_hash": _frame_hash(df),
            "dataset_files": ["<DataFrame>"],
            "tokenizer_sha256": tok,
        }
        return df
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
        if pairs:
            ids[man["task"]] = _label_ids(f, df, man, command)
        shas.append(man["sha256"])
        toks.add((man.get("tokenizer") or {}).get("sha256"))
        frames.append(df)
    if not frames:
        raise FbtError(f"{path}: no dataset of task(s) {sorted(tasks)}")
    if len(toks) > 1:
        raise FbtError(f"{path}: its datasets were tokenized with different tokenizers")
    out = pd.concat(frames, ignore_index=True)
    out.attrs = {
        "dataset_sha256": shas,
        "dataset_files": [str(f) for f in files],
        "tokenizer_sha256": toks.pop(),
        "dataset_hash": hashlib.sha256("".join(shas).encode()).hexdigest(),
    }
    if pairs:
        out.attrs["label_token_ids"] = ids
    return out


def _label_ids(f: Path, df: pd.DataFrame, manifest: dict, command: str = "patch") -> tuple[int, int]:
    """(id of the label-0 word, id of the label-1 word) of one pair dataset, refused when the words
    are not two distinct single tokens or one is the tokenizer's unknown token (datasets written
    before generation refused them: the logit difference would be taken against <unk>)."""
    if df.empty:
        raise FbtError(f"{f}: the dataset has no rows; nothing to {command}")
    known = (manifest.get("tokenizer") or {}).get("label_token_ids") or {}
    words = {int(k): v for k, v in manifest["spec"]["label_words"].items()}
    if any(known.get(words[c]) is None for c in (0, 1)):
        raise FbtError(f"{f}: label words {words} are not single tokens under the dataset's tokenizer")
    ids = (int(known[words[0]]), int(known[words[1]]))
    if ids[0] == ids[1]:
        raise FbtError(f"{f}: label words {words[0]!r} and {words[1]!r} have the same token id {ids[0]}")
    tok_file = f.parent / ((manifest.get("tokenizer") or {}).get("file") or "tokenizer.json")
    if tok_file.is_file():
        unk = unk_id(load_tokenizer(tok_file))
        for label, tid in enumerate(ids):
            if unk is not None and tid == unk:
                raise FbtError(
                    f"{f}: label word {words[label]!r} is the unknown token of {tok_file} "
                    "(regenerate the dataset with a tokenizer that has it)"
                )
    return ids


def check_compatible(
    model, df: pd.DataFrame, tokenizer: Path | None = None, where: str = "dataset", exact_tokenizer: bool = False
) -> None:
    """Refuse a dataset the model cannot read: missing columns, no rows, an empty sample, a sample
    longer than the context, token ids outside the vocabulary, or a dataset made with another
    tokenizer than the checkpoint's `tokenizer`. By default a tokenizer with another sha256 passes
    when it re-encodes two samples per task to the same ids; `exact_tokenizer` (the intervention
    commands) refuses any other sha256. Messages start with `where`."""
    missing = {"token_ids", *SAMPLE_COLUMNS} - set(df.columns)
    if missing:
        raise FbtError(f"{where}: dataset lacks column(s) {sorted(missing)}")
    if df.empty:
        raise FbtError(f"{where}: the dataset has no rows; nothing to extract")
    if min(len(ids) for ids in df["token_ids"]) == 0:
        raise FbtError(f"{where}: a sample has no tokens")
    longest = max(len(ids) for ids in df["token_ids"])
    if longest > model.cfg.n_ctx:
        raise FbtError(f"{where}: a sample of {longest} tokens exceeds the model's context n_ctx = {model.cfg.n_ctx}")
    low = min(min(ids) for ids in df["token_ids"])
    if low < 0:
        raise FbtError(f"{where}: token id {low} is outside the model's vocabulary 0..{model.cfg.d_vocab - 1}")
    top = max(max(ids) for ids in df["token_ids"])
    if top >= model.cfg.d_vocab:
        raise FbtError(
            f"{where}: token id {top} is outside the model's vocabulary of {model.cfg.d_vocab} "
            f"(dataset and model use different tokenizers)"
        )
    data_tok = df.attrs.get("tokenizer_sha256")
    if tokenizer is None and data_tok and arch_of(model) == NANOCHAT_ARCH:
        raise FbtError(
            f"{where}: the model has no tokenizer.json beside it, so nothing shows the dataset's tokenizer is its "
            "own (import it with `fbt-probe model import-nanochat`, which brings its tokenizer)"
        )
    if tokenizer is None or (exact_tokenizer and not data_tok):
        return
    tok = load_tokenizer(tokenizer)
    recorded = _recorded_tokenizer(Path(tokenizer).parent)
    if recorded is not None and recorded != tokenizer_sha256(tok):
        raise FbtError(
            f"{tokenizer}: not the tokenizer its checkpoint was imported with (config.json records sha256 "
            f"{recorded[:12]}..., the file has {tokenizer_sha256(tok)[:12]}...)"
        )
    if data_tok is not None and tokenizer_sha256(tok) == data_tok:
        return
    if exact_tokenizer:
        raise FbtError(
            f"{tokenizer}: differs from the tokenizer the dataset was made with "
            "(regenerate the dataset with --tokenizer pointing at it)"
        )
    probe_rows = df.groupby("task").head(2)  # re-encode a few samples per task under the model's tokenizer
    for i, ids in zip(probe_rows.index, encode(tok, probe_rows["text"].tolist())):
        if list(ids) != list(map(int, df.at[i, "token_ids"])):
            raise FbtError(
                f"{where}: sample {i} ({df.at[i, 'task']}) has token ids that {tokenizer} does not "
                f"produce: the dataset was made with another tokenizer (regenerate it with "
                f"--tokenizer {tokenizer})"
            )


def _recorded_tokenizer(folder: Path) -> str | None:
    """The tokenizer sha256 an import recorded in the folder's config.json (import-hf: `tokenizer`,
    import-nanochat: `nanochat.tokenizer`), or None."""
    path = folder / "config.json"
    meta = read_json(path, "checkpoint config") if path.is_file() else {}
    if not isinstance(meta, dict):
        return None
    rec = meta.get("tokenizer") or (meta.get("nanochat") if isinstance(meta.get("nanochat"), dict) else {}).get(
        "tokenizer"
    )
    return rec.get("sha256") if isinstance(rec, dict) else None


def load_pairs(dataset, tasks=None, command: str = "patch") -> pd.DataFrame:
    """`load_data` of the intervention commands: every file has rows and single-token label words
    (``attrs["label_token_ids"]``)."""
    return load_data(dataset, tasks, pairs=True, command=command)


def open_pairs(
    run, dataset, tasks=None, device: str | None = None, seed: int = 0, command: str = "patch"
) -> tuple[LoadedModel, pd.DataFrame]:
    """(model, pair frame) of ``fbt-probe patch | lens RUN DATASET`` (`command`): the dataset is read
    first (its errors come before a model loads), then the model, then their compatibility, with the
    run's tokenizer required to be the dataset's. A Hidden Decoding model is refused: the
    interventions and the lens act on feedback passes and the serial scan, which it has none of."""
    df = load_pairs(dataset, tasks, command)
    lm = open_model(run, device or "cpu", seed)
    if arch_of(lm.model) == HIDDEN_ARCH:
        raise FbtError(
            f"{run}: a hidden-decoding model ({lm.model.cfg.n_streams} streams per token, one pass): "
            f"`fbt-probe {command}` needs a latent-feedback model (feedback passes, serial scan); "
            "study this one with `fbt-probe extract` and `fbt-probe probe`"
        )
    check_compatible(lm.model, df, lm.tokenizer, exact_tokenizer=True)
    return lm, df
