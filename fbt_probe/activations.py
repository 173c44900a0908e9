"""Residual-stream extraction at the final position, written as resumable safetensors shards.

`extract(model, dataset, modes, out_dir)` runs every sample under every prefill mode, batched by
exact token length (no padding), and keeps the final position of each probe depth d = 0..L
(`fbt_probe.hooks.depth_name`) plus any extra hooks. The pseudo-mode `carried-state` is always added
(unless `reference=False`): the state `recurrent:1` carries into the last position, h^L at position
T-2 under `standard` (`ln_final.hook_normalized` when the model carries the post-norm state),
probed as the reference line (docs/probes.md).

Layout of `out_dir`: `plan.json` (written first: what will be extracted), `samples.parquet`,
`shards/<mode>/<task>-T<len>-<i>.safetensors` (each written atomically, never rewritten) with its
sha256 beside it (`<shard>.sha256`, written before the shard is renamed into place), and
`manifest.json` (written last, with every shard's sha256). A folder with a plan but no manifest is
an interrupted extraction: calling `extract` again with the same inputs continues it, after checking
every finished shard against its recorded sha256. With `force`, an existing activation folder (and
only that: its `.fbt-output.json` marker names extract) is replaced: the new one is extracted in a
temporary sibling and swapped in when done, and the files extract did not write are carried into it.

What a mode's shards hold depends on the architecture (`ARCH_TARGETS`): a latent-feedback model
keeps depth.0..L per mode; a Hidden Decoding model has one mode, `standard`, holding the final
token's stream k at depth d as `stream.{k}.depth.{d}`, numbered stream-major
(`fbt_probe.hidden.stream_depth`), so the probe table's `depth` column runs over (stream, layer).
"""

from __future__ import annotations

import contextlib
import json
import re
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from rich.progress import TextColumn
from safetensors.torch import save_file

from fbt_probe import distributed
from fbt_probe.config import arch_of, check_device
from fbt_probe.engine.prefix import build_prefix
from fbt_probe.errors import FbtError
from fbt_probe.formats.nanochat.config import ARCH as NANOCHAT_ARCH
from fbt_probe.hidden.config import ARCH as HIDDEN_ARCH
from fbt_probe.hidden.streams import stream_depth, stream_position
from fbt_probe.hooks import depth_name
from fbt_probe.io import atomic_path, read_json, temp_sibling, write_json
from fbt_probe.loading import check_compatible, load_data, open_model
from fbt_probe.marker import swap_keeping, writing
from fbt_probe.model.transformer import FeedbackTransformer
from fbt_probe.modes import Mode, parse_modes
from fbt_probe.progress import bar
from fbt_probe.provenance import provenance
from fbt_probe.shards import (
    COMMAND,
    FORMAT,
    check_out_dir,
    foreign_files,
    mark,
    read_shard,
    record_sha256,
    verify_finished,
    verify_shards,
)
from fbt_probe.tasks import SAMPLE_COLUMNS

REFERENCE_MODE = "carried-state"
BATCH_SIZE = 16  # samples per forward unless the caller says otherwise
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass(frozen=True)
class Target:
    key: str  # tensor name in the shard
    hook: str
    position: int  # -1 = final token, -2 = the one before
    depth: int | None  # probe depth, None for an extra hook

    def to_dict(self) -> dict:
        return {"key": self.key, "hook": self.hook, "position": self.position, "depth": self.depth}


class _Stop(Exception):
    """Raised by the last collecting hook: nothing after it (final norm, unembedding) is needed."""


def _mode_slug(mode: str) -> str:
    return mode.replace(":", "-")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


# ----------------------------------------------------------------------------- targets
def targets_for(mode: str, model, extra_hooks=()) -> list[Target]:
    """What a mode's shards hold: every depth 0..L at the final position, plus extra hooks
    ('name' = final position, 'name@-2' = the position before)."""
    L = model.cfg.n_layers
    if mode == REFERENCE_MODE:
        post = getattr(model.cfg, "feedback_source", "pre_norm") == "post_norm"
        hook = "ln_final.hook_normalized" if post else depth_name(L)
        return [Target("carried", hook, -2, L)]
    out = [Target(f"depth.{d}", depth_name(d), -1, d) for d in range(L + 1)]
    for spec in extra_hooks:
        hook, _, pos = spec.partition("@")
        try:
            position = int(pos) if pos else -1
        except ValueError:
            raise FbtError(f"hook '{spec}': expected NAME or NAME@POSITION (e.g. @-2)") from None
        if position >= 0:
            raise FbtError(
                f"hook '{spec}': position {position}: expected a position from the end (-1 the final, -2 the one before)"
            )
        if hook not in model.hook_dict:
            raise FbtError(
                f"hooks: unknown hook '{hook}' (this model's hooks: {hook_patterns(model)}; "
                "`fbt-probe model info` lists every name)"
            )
        out.append(Target(f"{hook}@{position}", hook, position, None))
    return out


def hook_patterns(model) -> str:
    """The model's hook names with layer numbers folded into <l> (e.g. blocks.<l>.hook_resid_pre), comma-separated."""

    return ", ".join(dict.fromkeys(re.sub(r"\.\d+\.", ".<l>.", n) for n in model.hook_dict))


def stream_targets(mode: str, model, extra_hooks=()) -> list[Target]:
    """A Hidden Decoding model's one mode holds the final token's stream k at every layer depth d,
    numbered stream-major (`fbt_probe.hidden.stream_depth`); the hook column keeps the plain name."""
    L, n = model.cfg.n_layers, model.cfg.n_streams
    return [
        Target(f"stream.{k}.depth.{d}", depth_name(d), stream_position(-1, k, n), stream_depth(k, d, L))
        for k in range(1, n + 1)
        for d in range(L + 1)
    ]


def _stream_manifest(model) -> dict:
    cfg = model.cfg
    return {
        "model": {
            "arch": cfg.arch,
            "n_streams": cfg.n_streams,
            "cross_stream_layers": list(cfg.resolved_cross_stream_layers),
        },
        "depth": "stream-major: depth = (stream - 1) * (n_layers + 1) + layer depth",
    }


@dataclass(frozen=True)
class ArchTargets:
    """How `extract` reads one architecture (keyed by `fbt_probe.config.arch_of`)."""

    label: str  # for messages: "a Hidden Decoding model"
    default_modes: tuple[str, ...]  # when `modes` is None
    only_modes: tuple[str, ...] | None  # None: any prefill mode
    reference: bool  # has the carried-state pseudo-mode
    extra_hooks: bool  # takes extra hook names
    targets: Callable[..., list[Target]]  # (mode, model, extra_hooks) -> what a mode's shards hold
    manifest: Callable[[object], dict] = lambda model: {}  # extra plan / manifest fields


ARCH_TARGETS: dict[str, ArchTargets] = {
    "feedback": ArchTargets("a latent-feedback model", ("standard", "recurrent:1"), None, True, True, targets_for),
    HIDDEN_ARCH: ArchTargets(
        "a Hidden Decoding model", ("standard",), ("standard",), False, False, stream_targets, _stream_manifest
    ),
}
ARCH_TARGETS[NANOCHAT_ARCH] = ARCH_TARGETS["feedback"]  # a latent-feedback model with nanochat's backbone extras


# ----------------------------------------------------------------------------- running
@torch.no_grad()
def collect(
    model, tokens: torch.Tensor, mode: str, targets: list[Target], dtype=torch.float32
) -> dict[str, torch.Tensor]:
    """{key: [batch, d]} on CPU for `tokens` [batch, pos]; stops the forward once every hook fired.

    A latent-feedback model runs only the positions from the earliest target on with hooks, after
    the positions before it were computed once with hooks off (`fbt_probe.engine.prefix`, the
    one-pass rule: the activations are those of the one hooked pass, up to float rounding)."""
    run_mode = Mode("standard") if mode == REFERENCE_MODE else mode
    feedback = isinstance(model, FeedbackTransformer)
    T = tokens.shape[1]
    where = {t.key: t.position if t.position >= 0 else T + t.position for t in targets}  # global positions
    bad = [t.hook for t in targets if not 0 <= where[t.key] < T]
    if feedback and bad:
        raise FbtError(f"hook(s) {bad[:3]}: position outside a {T}-token sample")
    by_hook: dict[str, list[Target]] = {}
    for t in targets:
        by_hook.setdefault(t.hook, []).append(t)
    out: dict[str, torch.Tensor] = {}

    def grab(act, hook):
        ctx = model.hook_context if feedback else None  # the chunk's first global position
        for t in by_hook[hook.name]:
            i = t.position if ctx is None else where[t.key] - ctx.positions.start
            x = act[:, i].detach()
            if hook.name == "ln_final.hook_normalized" and model.ln_final.weight is not None:
                x = x * model.ln_final.weight.detach()  # the carried post-norm state: the norm's output, gain included
            out[t.key] = x.to("cpu", dtype).clone()
        if len(out) == len(targets):
            raise _Stop
        return act

    hooks = [(h, grab) for h in by_hook]
    try:
        if feedback:
            start = min(where.values())
            build_prefix(model, tokens, run_mode, upto=start).run(start, hooks)
        else:  # e.g. Hidden Decoding: positions index its n*T-long tensors, one full pass
            model.run_with_hooks(tokens, mode=run_mode, fwd_hooks=hooks)
    except _Stop:
        pass
    missing = [t.hook for t in targets if t.key not in out]
    if missing:
        raise FbtError(f"mode '{mode}': hook(s) {missing[:3]} never fired (unknown hook names?)")
    return out


def _preflight(model, df: pd.DataFrame, modes: list[str], targets: dict, dtype) -> None:
    """Run each mode once on the shortest sample: a mode the model cannot run fails before any write."""
    i = int(df["n_tokens"].idxmin())
    tokens = torch.tensor([list(df.at[i, "token_ids"])], dtype=torch.long, device=_device(model))
    for mode in modes:
        try:
            collect(model, tokens, mode, targets[mode], dtype)
        except FbtError as exc:
            msg = exc.format_message()
            raise FbtError(msg if msg.startswith(f"mode '{mode}'") else f"mode '{mode}': {msg}") from None
        except Exception as exc:  # any failure inside the model means it cannot run this mode
            raise FbtError(f"mode '{mode}': the model cannot run it ({type(exc).__name__}: {exc})") from None


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _plan(df: pd.DataFrame, modes: list[str], shard_rows: int) -> list[dict]:
    shards = []
    for mode in modes:
        for (T, task), rows in df.groupby(["n_tokens", "task"], sort=True).groups.items():  # lengths ascending
            rows = sorted(int(r) for r in rows)
            for i in range(0, len(rows), shard_rows):
                name = f"shards/{_mode_slug(mode)}/{task}-T{int(T):05d}-{i // shard_rows:03d}.safetensors"
                shards.append(
                    {"file": name, "mode": mode, "task": task, "n_tokens": int(T), "rows": rows[i : i + shard_rows]}
                )
    return shards


def _write_shard(
    model, df, shard: dict, targets: list[Target], batch_size: int, dtype, path: Path, on_batch=None
) -> str:
    """Write one shard (atomically) and its sha256 sidecar; returns the sha256. `on_batch(shard,
    n_rows)` is called after each forward."""
    parts: dict[str, list[torch.Tensor]] = {t.key: [] for t in targets}
    rows = shard["rows"]
    for i in range(0, len(rows), batch_size):
        batch = rows[i : i + batch_size]
        tokens = torch.tensor(
            np.stack([np.asarray(df.at[r, "token_ids"]) for r in batch]), dtype=torch.long, device=_device(model)
        )
        for key, value in collect(model, tokens, shard["mode"], targets, dtype).items():
            parts[key].append(value)
        if on_batch is not None:
            on_batch(shard, len(batch))
    tensors = {k: torch.cat(v).contiguous() for k, v in parts.items()}
    for key, value in tensors.items():
        if not torch.isfinite(value.float()).all():
            raise FbtError(
                f"mode '{shard['mode']}', {shard['task']} T={shard['n_tokens']}: non-finite "
                f"activations at '{key}' (NaN/inf in the model); nothing written for this shard"
            )
    tensors["row"] = torch.tensor(rows, dtype=torch.int64)
    with atomic_path(path) as tmp:
        # one metadata key: safetensors does not keep the order of several, and shards must be byte-stable
        save_file(tensors, str(tmp), metadata={"fbt_probe": json.dumps({"format": FORMAT, "mode": shard["mode"]})})
        return record_sha256(tmp, path)  # recorded before the shard itself appears


def _arch_modes(arch: ArchTargets, modes: list | None, spec, source: str, extra_hooks, reference: bool) -> list:
    """The modes to extract: the architecture's default where none were given, refused where it has
    other modes or fixed targets, with the carried state added where it has one and `reference` asks."""
    modes = parse_modes(arch.default_modes, also=(REFERENCE_MODE,)) if modes is None else modes
    if arch.only_modes is not None and [m for m in modes if m != REFERENCE_MODE] != list(arch.only_modes):
        raise FbtError(
            f"modes '{spec}': {source} is {arch.label}, which has only mode "
            f"{', '.join(repr(m) for m in arch.only_modes)}"
        )
    if extra_hooks and not arch.extra_hooks:
        raise FbtError(f"hooks: not supported for {arch.label} ({source}): its targets are fixed")
    if reference and arch.reference and REFERENCE_MODE not in modes:
        modes.append(REFERENCE_MODE)
    return modes


def _manifest_plan(lm, model, arch: ArchTargets, df, modes, targets, dtype, shard_rows, batch_size) -> dict:
    """The manifest of the extraction before it runs: model, dataset, modes, targets and shards."""
    extra, data = arch.manifest(model), df.attrs
    return {
        "format": FORMAT,
        "model": {
            "source": lm.source,
            "hash": lm.hash,
            "n_layers": model.cfg.n_layers,
            "d_model": model.cfg.d_model,
            **extra.pop("model", {}),
        },
        "dataset": {
            "paths": data["dataset_files"],
            "hash": data["dataset_hash"],
            "tokenizer_sha256": data["tokenizer_sha256"],
        },
        "modes": modes,
        "dtype": dtype,
        "shard_rows": shard_rows,
        "batch_size": batch_size,
        "targets": {m: [t.to_dict() for t in ts] for m, ts in targets.items()},
        "shards": _plan(df, modes, shard_rows),
        **extra,
    }


def extract(
    model,
    dataset,
    modes,
    out_dir,
    *,
    extra_hooks=(),
    reference: bool = True,
    batch_size: int = BATCH_SIZE,
    shard_rows: int = 256,
    dtype: str = "float32",
    device: str | None = None,
    force: bool = False,
    progress=None,
    on_shard=None,
    require_arch: str | None = None,
) -> "ActivationStore":
    """Extract activations (see module doc); returns the finished `ActivationStore`.

    `model`: a model object, preset name, ``ref:<name>``, checkpoint or run folder (`fbt_probe.
    loading.open_model`); `dataset`: a dataset file, a folder of them or a DataFrame; `modes`: list
    or comma-separated string, None for the architecture's default (`ARCH_TARGETS`). A Hidden
    Decoding model has only mode `standard` (its streams x depths; `reference` and `extra_hooks`
    do not apply). `progress(done, total, shard)` and `on_shard(shard)` are called after each shard
    (the latter lets tests interrupt an extraction); a `progress` object may also have
    `start(shards)`, called with this process's shards before the first one, and `batch(shard,
    n_rows)`, called after each forward (`ExtractProgress`, the command's bar, has both);
    `require_arch` refuses a model of another architecture.
    """
    out_dir = Path(out_dir)
    spec = modes
    if modes is not None:
        modes = parse_modes(modes, also=(REFERENCE_MODE,))
    check_device(device)
    device = distributed.device_for(device)
    if dtype not in DTYPES:
        raise FbtError(f"dtype '{dtype}': expected one of {sorted(DTYPES)}")
    if batch_size < 1 or shard_rows < 1:
        raise FbtError("batch size and shard rows must be >= 1")
    lm = open_model(model, device)
    model = lm.model.eval()  # training mode adds noise to the carried states
    if require_arch is not None and arch_of(model) != require_arch:
        raise FbtError(f"{lm.source}: not a {require_arch} model (use fbt_probe.activations.extract)")
    arch = ARCH_TARGETS[arch_of(model)]
    modes = _arch_modes(arch, modes, spec, lm.source, extra_hooks, reference)
    targets = {m: arch.targets(m, model, extra_hooks) for m in modes}  # bad hook names refused before any data is read
    df = load_data(dataset)
    data_hash, data_paths = df.attrs["dataset_hash"], df.attrs["dataset_files"]
    check_compatible(model, df, lm.tokenizer, where=str(data_paths[0]) if len(data_paths) == 1 else str(dataset))
    plan = _manifest_plan(lm, model, arch, df, modes, targets, dtype, shard_rows, batch_size)
    with contextlib.ExitStack() as held:

        def prepare():  # rank 0 alone holds the folder's lock, looks at it and prepares it
            held.enter_context(writing(out_dir, COMMAND))
            return _prepare(model, df, plan, targets, out_dir, force, dtype)

        # the others wait for its answer (or its error)
        action, work, keep = distributed.on_main(prepare)
        try:
            _run_plan(model, df, plan, targets, work, batch_size, dtype, progress, on_shard, lm.hash, data_hash)
            if action == "replace":  # a forced run over an earlier extraction: built beside it, swapped in when done
                distributed.on_main(lambda: swap_keeping(work, out_dir, keep))
        finally:
            if action == "replace" and distributed.world().main and work.exists():
                shutil.rmtree(work)
    return ActivationStore(out_dir)


def _prepare(
    model, df, plan: dict, targets: dict, out_dir: Path, force: bool, dtype: str
) -> tuple[str, Path, list[str]]:
    """(action, folder to write into, files a replaced folder keeps): checks `out_dir`, runs the
    preflight, and for a fresh or replacing run writes samples.parquet, plan.json and the marker first."""
    action = check_out_dir(out_dir, plan, force)
    keep = foreign_files(out_dir) if action == "replace" else []
    _preflight(model, df, plan["modes"], targets, DTYPES[dtype])  # before anything is written or removed
    work = temp_sibling(out_dir) if action == "replace" else out_dir
    if action == "resume":
        _drop_temporaries(out_dir)
    else:
        work.mkdir(parents=True, exist_ok=True)
        samples = df[list(SAMPLE_COLUMNS)].copy()
        samples.insert(0, "row", np.arange(len(df), dtype=np.int64))
        with atomic_path(work / "samples.parquet") as tmp:
            samples.to_parquet(tmp, index=False)
        write_json(work / "plan.json", plan)
        mark(work, ("samples.parquet", "plan.json"))
    return action, work, keep


def _drop_temporaries(out_dir: Path) -> None:
    """Half-written temporary files a killed process left (`.<name>.<random>.tmp`, never renamed)."""
    for tmp in (out_dir / "shards").glob("*/.*.tmp"):
        if tmp.is_file():
            tmp.unlink()


def extract_streams(model, dataset, out_dir, **kwargs) -> "ActivationStore":
    """`extract` of a Hidden Decoding model: its one mode, `standard`, holds every stream at every
    depth (`stream_targets`). A latent-feedback model is refused."""
    return extract(model, dataset, ("standard",), out_dir, reference=False, require_arch=HIDDEN_ARCH, **kwargs)


def shard_cost(shard: dict) -> float:
    """Relative work of a shard: samples x tokens (x passes of a jacobi:K or full mode is left out:
    every shard of a mode has the same multiplier, and modes are balanced across ranks alike)."""
    return float(len(shard["rows"]) * shard["n_tokens"])


class ExtractProgress:
    """The rich bar of `fbt-probe extract` (`fbt_probe.progress.bar`, as `train` draws its own): one
    bar over this process's shards, each weighted by its work, samples x tokens (`shard_cost`), so
    that the ETA does not take a long shard for a short one; it moves after every forward and jumps
    over a shard an interrupted run already finished. Pass it as `extract(progress=...)` and stop it
    after (`with ExtractProgress(console):`); `console`: a rich Console (default: stderr)."""

    def __init__(self, console=None):
        if console is None:
            console = Console(stderr=True)
        self.console, self.progress, self.task, self.costs = console, None, None, []

    def start(self, shards: list[dict]) -> None:

        self.costs = [shard_cost(s) for s in shards]
        self.progress, self.task = bar(
            "extract",
            float(sum(self.costs)),
            0,
            TextColumn("{task.percentage:>3.0f}%"),
            TextColumn("{task.fields[shards]} shards"),
            TextColumn("{task.fields[what]}"),
            console=self.console,
            shards=f"0/{len(shards)}",
            what="",
        )

    def batch(self, shard: dict, n_rows: int) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, float(n_rows * shard["n_tokens"]))

    def __call__(self, done: int, total: int, shard: dict) -> None:
        if self.progress is not None:
            self.progress.update(
                self.task,
                completed=sum(self.costs[:done]),
                shards=f"{done}/{total}",
                what=f"{shard['mode']} {shard['task']} T={shard['n_tokens']}",
            )

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __enter__(self) -> "ExtractProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _run_plan(
    model,
    df,
    plan: dict,
    targets: dict,
    out_dir: Path,
    batch_size: int,
    dtype: str,
    progress,
    on_shard,
    model_hash: str,
    data_hash: str,
) -> None:
    """Write this rank's shards of the plan (all of them in a world of one; `distributed.assign`
    otherwise), then rank 0 writes the manifest once every rank has finished."""
    world = distributed.world()
    owner = distributed.assign([shard_cost(s) for s in plan["shards"]], world.size)
    mine = [(n, s) for n, s in enumerate(plan["shards"]) if owner[n] == world.rank]
    written, error = {}, None
    if callable(getattr(progress, "start", None)):
        progress.start([s for _, s in mine])
    on_batch = getattr(progress, "batch", None)
    try:
        for done, (n, shard) in enumerate(mine):
            path = out_dir / shard["file"]
            if path.exists():  # a finished shard is kept as it is, once its bytes match the recorded sha256
                digest = verify_finished(path)
            else:
                digest = _write_shard(
                    model,
                    df,
                    shard,
                    targets[shard["mode"]],
                    batch_size,
                    DTYPES[dtype],
                    path,
                    on_batch if callable(on_batch) else None,
                )
            written[n] = {"sha256": digest, "rss_mb": round(_rss_mb(), 1)}
            if progress is not None:
                progress(done + 1, len(mine), shard)
            if on_shard is not None:
                on_shard(shard)
    except FbtError as exc:
        if not world.several:
            raise
        error = exc.format_message()
    distributed.all_ok(error)  # a rank's bad shard stops every rank with its message
    parts = distributed.gather((written, round(_rss_mb(), 1)))
    if world.main:
        _write_manifest(plan, parts, df, out_dir, world.size, model_hash, data_hash)
    distributed.barrier()  # nobody returns before the manifest exists


def _write_manifest(
    plan: dict, parts: list, df, out_dir: Path, world_size: int, model_hash: str, data_hash: str
) -> None:
    by_shard = {n: rec for recs, _ in parts for n, rec in recs.items()}
    written = [{**shard, **by_shard[n]} for n, shard in enumerate(plan["shards"])]
    # ru_maxrss is a process's high-water mark; lengths ascend within a mode, so the value after
    # the first mode's largest length bounds the memory that length needed (in the process that ran it).
    largest = max(s["n_tokens"] for s in written)
    first_largest = next(s for s in written if s["n_tokens"] == largest)
    manifest = {
        **plan,
        "shards": written,
        "n_samples": len(df),
        "world_size": world_size,
        "peak_rss_mb": {
            "largest_length": largest,
            "after_largest_length": first_largest["rss_mb"],
            "overall": max(rss for _, rss in parts),
        },
    }
    manifest["provenance"] = provenance(model_hash=model_hash, dataset_hash=data_hash)
    write_json(out_dir / "manifest.json", manifest)
    mark(out_dir, ("samples.parquet", "plan.json", "manifest.json"))


# ----------------------------------------------------------------------------- reading
def _numpy(t: torch.Tensor) -> np.ndarray:
    return (t if t.dtype in (torch.float32, torch.float64) else t.float()).numpy()


class ActivationStore:
    """A finished extraction folder: `samples`, `modes`, `targets(mode)`, `load(mode, task, length)`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not (self.path / "manifest.json").exists():
            hint = " (unfinished: run extract again to resume it)" if (self.path / "plan.json").exists() else ""
            raise FbtError(f"{self.path}: no manifest.json, not a finished activation folder{hint}")
        self.manifest = read_json(self.path / "manifest.json", "activation manifest")
        if self.manifest.get("format") != FORMAT:
            raise FbtError(f"{self.path / 'manifest.json'}: field 'format': expected {FORMAT!r}")
        try:
            self.samples = pd.read_parquet(self.path / "samples.parquet")
        except Exception as exc:
            raise FbtError(f"{self.path / 'samples.parquet'}: unreadable ({exc})") from None

    @property
    def modes(self) -> list[str]:
        return list(self.manifest["modes"])

    def verify(self) -> None:
        """Check every shard against the sha256 in the manifest (before hours of fitting, not during)."""
        verify_shards(self.path, self.manifest["shards"])

    def targets(self, mode: str) -> list[Target]:
        return [Target(**t) for t in self.manifest["targets"][mode]]

    def conditions(self) -> list[tuple[str, str, int]]:
        """(mode, task, length knob) cells in a stable order."""
        cells = self.samples[["task", "length_knob"]].drop_duplicates().sort_values(["task", "length_knob"])
        return [(m, str(t), int(k)) for m in self.modes for t, k in cells.itertuples(index=False)]

    def load(self, mode: str, task: str, length: int) -> tuple[np.ndarray, pd.DataFrame, list[Target]]:
        """(X [n_targets, n, d], sample rows in row order, targets) of one cell; X is float32 unless
        the activations were stored as float64."""
        if mode not in self.manifest["targets"]:
            raise FbtError(f"{self.path}: no activations for mode '{mode}' (have {', '.join(self.modes)})")
        rows = self.samples[(self.samples.task == task) & (self.samples.length_knob == length)]
        wanted = set(rows["row"].tolist())
        targets = self.targets(mode)
        parts, got_rows = [], []
        for shard in self.manifest["shards"]:
            if shard["mode"] != mode or shard["task"] != task or not wanted.intersection(shard["rows"]):
                continue
            data = read_shard(self.path / shard["file"], shard["sha256"])
            keep = np.isin(data["row"].numpy(), list(wanted))
            parts.append(np.stack([_numpy(data[t.key])[keep] for t in targets]))
            got_rows.append(data["row"].numpy()[keep])
        if not parts:
            raise FbtError(f"{self.path}: no shards hold {task} length {length} under mode '{mode}'")
        row_ids = np.concatenate(got_rows)
        order = np.argsort(row_ids)
        X = np.concatenate(parts, axis=1)[:, order]
        if len(row_ids) != len(wanted):
            raise FbtError(
                f"{self.path}: {task} length {length}, mode '{mode}': shards hold {len(row_ids)} of "
                f"{len(wanted)} samples"
            )
        return X, rows.set_index("row").loc[row_ids[order]].reset_index(), targets
