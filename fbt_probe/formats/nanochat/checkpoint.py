"""Checkpoints of the public nanochat latent-feedback reproduction (GitHub
xidulu/Full-bandwidth-transformer, `nanochat/gpt.py` with `LATENT_FEEDBACK_MODES`) -> our model.

Their folder holds `model_<step>.pt` (a state dict, keys of their `GPT`, possibly `_orig_mod.`
prefixed, possibly bf16) and `meta_<step>.json` (`model_config`: their `GPTConfig` fields; an absent
key takes the default their loader patches in). What their model computes, and the field of ours
that represents it (`NanochatConfig`, computed by `NanochatTransformer`, both in this package):

- every RMSNorm without weight, eps = float32 eps (`norm_weights=False`, `rms_eps`);
- embedding looked up (times 0.8/0.001 when tied), RMS-normed, then the smear (`embed_scale`,
  `embed_norm`, `smear`); per-layer `resid_lambdas` / `x0_lambdas` (`x0_mixing`); value embeddings
  on layers l with l % 2 == (L - 1) % 2, gate 3σ(W x[:12]) (`value_embed_layers`); backout of block
  L // 2 (`backout_layer`); ReLU² MLP of width 4D (`mlp_act="relu2"`);
- RoPE base 100,000 in the half-split layout rotating by -θ (`rope_sign=-1`), QK-norm after RoPE,
  q and k times 1.2 (`qk_norm_after_rope`, `qk_scale`); GQA; logits soft-capped at 15, the padded
  vocabulary rows cropped (exact: ids >= vocab_size never occur and their logits are dropped);
- sliding windows from `window_pattern` ("L" = sequence_len, "S" = ceil(sequence_len / 4 / 128) · 128,
  the last layer always "L"). Their window w lets a query see w keys before itself (w + 1 in all),
  ours counts the query: window = w + 1. n_ctx = sequence_len, so "L" never bites;
- latent feedback: `latent_feedback_mode` -> `fusion`; only the active matrices are kept.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path

import torch

from fbt_probe.config import FLOAT32_EPS, MAX_N_CTX
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import load_checkpoint, save_checkpoint
from fbt_probe.formats.nanochat.config import NanochatConfig
from fbt_probe.formats.nanochat.model import NanochatTransformer
from fbt_probe.formats.nanochat.tokenizer import bos_id, check_count, check_fits, load_tokenizer_file, read_pickle
from fbt_probe.io import atomic_path, read_json, sha256_file

DEFAULTS = {  # their GPTConfig defaults, and what their loader patches into an old meta
    "sequence_len": 2048,
    "vocab_size": 32768,
    "n_layer": 12,
    "n_head": 6,
    "n_kv_head": 6,
    "n_embd": 768,
    "window_pattern": "L",
    "latent_feedback": False,
    "latent_feedback_mode": "gate_product",
    "weight_tying": False,
}
MODES = ("gate_product", "concat_projection", "linear_addition")
FUSION_KEYS = {"state_proj": "W_U", "token_gate": "W_G", "concat_proj": "W_C", "token_proj": "W_T"}
ACTIVE = {
    "gate_product": ("state_proj", "token_gate"),
    "concat_projection": ("concat_proj",),
    "linear_addition": ("state_proj", "token_proj"),
}
TIED_EMBEDDING_SCALE = 0.8 / 0.001  # their EMBEDDING_INIT_STD / LM_HEAD_INIT_STD
ROPE_BASE = 100_000.0
PAD_TO = 64  # their pad_vocab_size_to
_BLOCK = {  # theirs -> ours, inside layer l
    "attn.c_q.weight": "attn.q_proj.weight",
    "attn.c_k.weight": "attn.k_proj.weight",
    "attn.c_v.weight": "attn.v_proj.weight",
    "attn.c_proj.weight": "attn.o_proj.weight",
    "attn.ve_gate.weight": "attn.ve_gate.weight",
    "mlp.c_fc.weight": "mlp.up_proj.weight",
    "mlp.c_proj.weight": "mlp.down_proj.weight",
}
_TOP = {
    "resid_lambdas": "resid_lambdas",
    "x0_lambdas": "x0_lambdas",
    "smear_gate.weight": "smear_gate.weight",
    "smear_lambda": "smear_lambda",
    "backout_lambda": "backout_lambda",
}
_STEP = re.compile(r"^model_(\d+)\.pt$")


# ----------------------------------------------------------------------------- the folder
def steps(folder: Path) -> list[int]:
    """The steps with both model_<step>.pt and meta_<step>.json in `folder` (ascending)."""
    out = []
    for p in Path(folder).glob("model_*.pt"):
        m = _STEP.match(p.name)
        if m and (folder / f"meta_{m.group(1)}.json").is_file():
            out.append(int(m.group(1)))
    return sorted(set(out))


def pt_sha256(folder: Path) -> str:
    """sha256 of the last step's model_<step>.pt: a nanochat folder's identity in provenance."""
    last = steps(folder)[-1]
    return sha256_file(next(p for p in sorted(Path(folder).glob("model_*.pt")) if int(p.stem.split("_")[1]) == last))


def is_nanochat_folder(folder: Path) -> bool:
    folder = Path(folder)
    return folder.is_dir() and bool(steps(folder))


def _files(folder: Path, step: int | None) -> tuple[Path, Path, int]:
    have = steps(folder)
    if not have:
        raise FbtError(f"{folder}: no nanochat checkpoint (model_<step>.pt with meta_<step>.json) in it")
    if step is None:
        step = have[-1]
    for p in sorted(folder.glob("model_*.pt")):
        m = _STEP.match(p.name)
        if m and int(m.group(1)) == step and (folder / f"meta_{m.group(1)}.json").is_file():
            return p, folder / f"meta_{m.group(1)}.json", step
    raise FbtError(f"{folder}: --step {step}: no model_<step>.pt/meta_<step>.json of that step (steps here: {have})")


def read_model_config(meta: dict, source: str) -> dict:
    """Their `model_config` with the defaults their loader uses for absent keys; unknown keys refused."""
    if not isinstance(meta, dict) or not isinstance(meta.get("model_config"), dict):
        raise FbtError(f"{source}: field 'model_config': expected an object (a nanochat meta_<step>.json)")
    mc = meta["model_config"]
    unknown = sorted(set(mc) - set(DEFAULTS) - {"latent_feedback_mode"})
    if unknown:
        raise FbtError(
            f"{source}: field 'model_config.{unknown[0]}' is not a GPTConfig field this importer knows; "
            "refusing to guess what it changes"
        )
    return {**DEFAULTS, **mc}


def window_sizes(mc: dict) -> list[int]:
    """Their per-layer left window (keys before the query), as their `_compute_window_sizes`."""
    pattern = mc["window_pattern"].upper()
    long_window = mc["sequence_len"]
    short_window = -(-long_window // 4 // 128) * 128
    sizes = [long_window if pattern[l % len(pattern)] == "L" else short_window for l in range(mc["n_layer"])]
    sizes[-1] = long_window
    return sizes


def config_from_meta(mc: dict, source: str) -> NanochatConfig:
    """Our config for their `model_config` (defaults filled); a one-line error names a field we cannot represent."""

    def refuse(field: str, why: str):
        raise FbtError(f"{source}: field 'model_config.{field}' {why}")

    for name in ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd"):
        v = mc[name]
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            refuse(name, f"must be an integer >= 1, got {v!r}")
    if mc["sequence_len"] > MAX_N_CTX:
        refuse("sequence_len", f"must be at most {MAX_N_CTX:,} (the context length), got {mc['sequence_len']:,}")
    for name in ("latent_feedback", "weight_tying"):
        if not isinstance(mc[name], bool):
            refuse(name, f"must be true or false, got {mc[name]!r}")
    pattern = mc["window_pattern"]
    if not isinstance(pattern, str) or not pattern or any(c not in "SL" for c in pattern.upper()):
        refuse("window_pattern", f"must be a non-empty string of S and L, got {pattern!r}")
    if mc["latent_feedback_mode"] not in MODES:
        refuse("latent_feedback_mode", f"is {mc['latent_feedback_mode']!r}; expected one of {MODES}")
    D, H, KV, L = mc["n_embd"], mc["n_head"], mc["n_kv_head"], mc["n_layer"]
    if D % H:
        refuse("n_embd", f"{D} is not a multiple of n_head {H}")
    if H % KV:
        refuse("n_head", f"{H} is not a multiple of n_kv_head {KV}")
    if (D // H) % 2:
        refuse("n_embd", f"gives an odd head dimension {D // H} (RoPE rotates pairs)")
    if D < 24:
        refuse("n_embd", f"{D} is below the 24 channels their smear gate reads")
    n_ctx = mc["sequence_len"]
    windows = [w + 1 for w in window_sizes(mc)]  # theirs: w keys before the query; ours: the query and w before it
    short = sorted({w for w in windows if w < n_ctx})  # a window >= n_ctx never bites: a full layer
    if len(short) > 1:
        refuse("window_pattern", f"gives several window sizes {short}; one is supported")
    types = tuple("sliding_attention" if w < n_ctx else "full_attention" for w in windows)
    try:
        return NanochatConfig(
            d_vocab=mc["vocab_size"],
            d_model=D,
            n_layers=L,
            n_heads=H,
            n_key_value_heads=KV,
            d_head=D // H,
            d_mlp=4 * D,
            n_ctx=n_ctx,
            window=short[0] if short else None,
            layer_types=types,
            rope_theta=ROPE_BASE,
            rms_eps=FLOAT32_EPS,
            depth_scaling="none",
            feedback_source="post_norm",
            fusion=mc["latent_feedback_mode"],
            norm_weights=False,
            embed_scale=TIED_EMBEDDING_SCALE if mc["weight_tying"] else 1.0,
            embed_norm=True,
            smear=True,
            smear_channels=24,
            x0_mixing=True,
            value_embed_layers=tuple(l for l in range(L) if l % 2 == (L - 1) % 2),
            value_embed_gate_channels=12,
            backout_layer=L // 2,
            mlp_act="relu2",
            rope_sign=-1,
            qk_norm_after_rope=True,
            qk_scale=1.2,
            logit_softcap=15.0,
            tie_embeddings=mc["weight_tying"],
        )
    except FbtError as exc:
        raise FbtError(f"{source}: {exc.format_message()}") from None


# ----------------------------------------------------------------------------- the weights
def read_state(path: Path) -> dict[str, torch.Tensor]:
    """Their state dict: torch.load with weights_only=True (no pickled code runs), `_orig_mod.` stripped."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is one line naming the file
        raise FbtError(f"{path}: not a loadable state dict ({type(exc).__name__}: {_why(exc)})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise FbtError(f"{path}: expected a state dict (names -> tensors)")
    return {k.removeprefix("_orig_mod."): v for k, v in state.items()}


def _why(exc: Exception) -> str:
    """The reason a load failed, without torch's advice to load with weights_only=False (which on
    these files would run the code they embed)."""
    text = str(exc)
    if "Weights only load failed" in text:
        return "it holds pickled objects other than tensors, which could run code when loaded; refused unloaded"
    return (text.splitlines() or [""])[0][:200]


def key_map(cfg: NanochatConfig, latent_feedback: bool) -> dict[str, str]:
    """Their key -> ours, for every tensor our model takes from their checkpoint."""
    names = {"transformer.wte.weight": "embed.weight", **_TOP}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "unembed.weight"
    for l in range(cfg.n_layers):
        for theirs, ours in _BLOCK.items():
            if theirs.startswith("attn.ve_gate") and l not in cfg.value_embed_layers:
                continue
            names[f"transformer.h.{l}.{theirs}"] = f"blocks.{l}.{ours}"
        if l in cfg.value_embed_layers:
            names[f"value_embeds.{l}.weight"] = f"blocks.{l}.attn.value_embed.weight"
    if latent_feedback:
        for theirs in ACTIVE[cfg.fusion]:
            names[f"latent_feedback.{theirs}.weight"] = f"fusion.{FUSION_KEYS[theirs]}.weight"
    return names


def to_ours(
    state: dict[str, torch.Tensor], cfg: NanochatConfig, latent_feedback: bool, source: str
) -> tuple[dict, list[str]]:
    """(our state dict, the names of their tensors left out: dormant fusion matrices). Padded vocabulary
    rows are cropped; a tied checkpoint's lm_head must equal its embedding."""
    state = dict(state)
    if "resid_lambdas" not in state:  # what their loader patches into old checkpoints
        state["resid_lambdas"] = torch.ones(cfg.n_layers)
    if "x0_lambdas" not in state:
        state["x0_lambdas"] = torch.zeros(cfg.n_layers)
    names = key_map(cfg, latent_feedback)
    missing = [k for k in names if k not in state]
    if missing:
        raise FbtError(f"{source}: tensor '{missing[0]}' missing (model_config says it exists)")
    dormant = sorted(k for k in state if k.startswith("latent_feedback.") and k not in names)
    extra = sorted(
        k for k in state if k not in names and k not in dormant and not (cfg.tie_embeddings and k == "lm_head.weight")
    )
    if extra:
        raise FbtError(
            f"{source}: tensor '{extra[0]}' is not part of the model model_config describes; refusing to drop it"
        )
    if not latent_feedback and dormant:
        raise FbtError(f"{source}: tensor '{dormant[0]}' present but field 'model_config.latent_feedback' is false")
    if (
        cfg.tie_embeddings
        and "lm_head.weight" in state
        and not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    ):
        raise FbtError(
            f"{source}: tensor 'lm_head.weight' differs from 'transformer.wte.weight' although "
            "field 'model_config.weight_tying' is true"
        )
    V = cfg.d_vocab
    ours = {}
    for theirs, mine in names.items():
        t = state[theirs]
        if theirs in ("transformer.wte.weight", "lm_head.weight") or theirs.startswith("value_embeds."):
            if t.shape[0] < V:
                raise FbtError(f"{source}: tensor '{theirs}' has {t.shape[0]} rows, fewer than vocab_size {V}")
            t = t[:V]  # their vocabulary padding (a multiple of 64) cropped
        ours[mine] = t.float()
    return ours, dormant


def to_theirs(model, padded_vocab: int | None = None) -> dict[str, torch.Tensor]:
    """Our imported model's tensors under their key names (their layout: vocabulary rows zero-padded to a
    multiple of 64, a tied lm_head equal to the embedding, the inactive fusion matrices as zeros)."""
    cfg = model.cfg
    V = cfg.d_vocab
    Vp = padded_vocab or -(-V // PAD_TO) * PAD_TO
    sd = model.state_dict()
    out = {}
    for theirs, mine in key_map(cfg, True).items():
        t = sd[mine].detach().cpu()
        if theirs in ("transformer.wte.weight", "lm_head.weight") or theirs.startswith("value_embeds."):
            t = torch.cat([t, t.new_zeros(Vp - V, t.shape[1])])
        out[theirs] = t
    if cfg.tie_embeddings:
        out["lm_head.weight"] = out["transformer.wte.weight"]
    D = cfg.d_model
    for theirs in FUSION_KEYS:
        out.setdefault(f"latent_feedback.{theirs}.weight", torch.zeros(D, 2 * D if theirs == "concat_proj" else D))
    return out


# ----------------------------------------------------------------------------- import
def import_nanochat(folder: str | Path, step: int | None = None, seed: int = 0):
    """(our model, provenance record, notes) for their checkpoint folder at `step` (default: the last)."""
    folder = Path(folder)
    pt, meta_path, step = _files(folder, step)
    meta = read_json(meta_path, "nanochat meta")
    mc = read_model_config(meta, str(meta_path))
    cfg = config_from_meta(mc, str(meta_path))
    state = read_state(pt)
    ours, dormant = to_ours(state, cfg, mc["latent_feedback"], str(pt))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = NanochatTransformer(cfg)
    expected = model.state_dict()
    for name, t in ours.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise FbtError(
                f"{pt}: tensor for '{name}' has shape {tuple(t.shape)}, model_config implies {tuple(expected[name].shape)}"
            )
    left = sorted(set(expected) - set(ours))
    if mc["latent_feedback"] and left:
        raise FbtError(f"{pt}: our model needs '{left[0]}', which the checkpoint does not provide")
    model.load_state_dict(ours, strict=False)
    notes = _notes(meta, mc)
    record = {
        "source": str(folder),
        "step": step,
        "model_file": pt.name,
        "model_sha256": sha256_file(pt),
        "model_config": mc,
        "dormant_fusion_tensors": dormant,
        "fusion_seed": None if mc["latent_feedback"] else seed,
        "notes": notes,
    }
    return model.eval(), record, notes


def _passes(meta: dict):
    for where in (meta, meta.get("user_config") or {}):
        if isinstance(where, dict) and isinstance(where.get("num_forward_passes"), int):
            return where["num_forward_passes"]
    return None


def _notes(meta: dict, mc: dict) -> list[str]:
    notes = []
    if not mc["latent_feedback"]:
        notes.append(
            "field 'model_config.latent_feedback' is false: the checkpoint has no fusion weights; fresh, "
            "untrained ones were added (seeded), so only 'standard' is the model's trained computation"
        )
    elif _passes(meta) == 1:
        notes.append(
            "a 'standard' baseline (num_forward_passes 1): its fusion weights are dormant, never trained; "
            "feedback modes run them as initialised"
        )
    return notes  # (the inactive fusion matrices every checkpoint carries are listed in the record, not here)


def load_nanochat(folder: str | Path, device: str = "cpu", seed: int = 0, step: int | None = None):
    """`fp.load_model` on their folder: the imported model, its notes as warnings."""
    model, _, notes = import_nanochat(folder, step=step, seed=seed)
    for note in notes:
        warnings.warn(f"{folder}: {note}", stacklevel=3)
    return model.to(device)


def read_import(folder: str | Path, step: int | None = None, seed: int = 0, tokenizer: Path | None = None):
    """Everything `fbt-probe model import-nanochat` writes, read and checked before anything is:
    (model, record, notes, tokenizer.json text or None). The tokenizer file `tokenizer` (nanochat's
    tokenizer.pkl, converted, or a tokenizer.json) must fit the checkpoint's vocabulary: a pickle's
    id count is compared before its merges are built."""
    model, record, notes = import_nanochat(folder, step=step, seed=seed)
    text = None
    if tokenizer is not None:
        rows = -(-model.cfg.d_vocab // PAD_TO) * PAD_TO
        if Path(tokenizer).suffix == ".pkl":  # the id count first: cheap, where the merge table is not
            check_count(read_pickle(tokenizer).n_ids, model.cfg.d_vocab, rows, str(tokenizer))
        tok = load_tokenizer_file(tokenizer)
        n = check_fits(tok, model.cfg.d_vocab, rows, str(tokenizer))
        text = tok.to_str(pretty=True)
        record["tokenizer"] = {
            "source": str(tokenizer),
            "source_sha256": sha256_file(tokenizer),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "n_ids": n,
            "bos_id": bos_id(tok),
        }
    else:
        record["tokenizer"] = None
    return model, record, notes, text


def write_import(folder: str | Path, out: Path, step: int | None = None, seed: int = 0, tokenizer: Path | None = None):
    """Import and write our checkpoint folder into `out` (an empty or temporary folder), with the
    tokenizer as tokenizer.json once it is shown to fit (`read_import`). Returns (record, notes)."""
    model, record, notes, text = read_import(folder, step, seed, tokenizer)
    write_read_import(model, record, text, folder, out)
    return record, notes


def write_read_import(model, record: dict, text: str | None, folder: str | Path, out: Path) -> None:
    """Write what `read_import` read into `out`."""
    tok_path = None
    if text is not None:
        tok_path = Path(out) / "tokenizer.json"
        with atomic_path(tok_path) as tmp:
            tmp.write_text(text)
    save_checkpoint(
        model, out, tok_path, extra={"imported_from": str(folder), "nanochat": json.loads(json.dumps(record))}
    )


def load_imported(folder: str | Path, device: str = "cpu"):
    """A checkpoint folder of ours holding a nanochat model (`fbt-probe model import-nanochat` wrote it)."""
    return load_checkpoint(folder, device, model_cls=NanochatTransformer, config_cls=NanochatConfig)
