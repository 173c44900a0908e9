"""What a TransformerLens user reaches for on `HookedTransformer`, on the latent-feedback model.

- `FeedbackActivationCache`: TransformerLens's `ActivationCache` (what `run_with_cache` returns in
  every mode). Its methods read `model.cfg` (`normalization_type`, `attn_only`, ...), the norms'
  `hook_scale`, `blocks[l].attn.W_O` and `blocks[l].mlp.W_out`, which the model provides. One
  difference is structural: under a feedback mode the layer-0 input is u_t = fusion(h_{t-1}, e_t),
  not the embedding, so the residual decompositions (`decompose_resid`,
  `get_full_resid_decomposition`) start from `blocks.0.hook_resid_pre`, labelled ``input`` (it is
  ``embed`` where the mode carries no state and the input is the plain embedding): the components
  still sum to the residual stream.
- `TransformerLensSurface`: weights in TransformerLens's shapes (`W_E`, `W_U`, `W_Q`, `W_K`, `W_V`,
  `W_O`, `W_in`, `W_gate`, `W_out`, `QK`, `OV`), the tokenizer helpers (`to_tokens`,
  `to_str_tokens`, `to_string`, `to_single_token`) and `generate` (our greedy decoding).
  `W_O` and `W_out` include the depth scaling (z @ W_O is the head's write to the stream); `W_U`
  folds in the final norm's gain, TransformerLens's fold_ln convention, matching `hook_normalized`
  and `apply_ln` (x / scale, before the gain), so `logit_attrs` of a stack normalised with
  `apply_ln` sum to the logits (before any soft-capping).
- `without_wrappers`: the hooks-off computations of carried states run with module-level
  `forward` overrides lifted, so a wrapper that instruments modules that way (nnsight) sees only
  the analysed pass, the one whose activations the mode defines.
"""

from __future__ import annotations

import contextlib

import torch
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.FactoredMatrix import FactoredMatrix
from transformer_lens.utilities import Slice

from fbt_probe.errors import FbtError
from fbt_probe.modes import Mode
from fbt_probe.surface.decoding import generate as greedy
from fbt_probe.tokens import check_mask


def is_text(x) -> bool:
    """Whether a model input is text (a string or a list of strings) rather than token ids."""
    return isinstance(x, str) or (isinstance(x, list) and bool(x) and isinstance(x[0], str))


class FeedbackActivationCache(ActivationCache):
    """`ActivationCache` of a latent-feedback model; `mode` is the prefill mode it was cached under."""

    def __init__(self, cache_dict, model, has_batch_dim: bool = True, mode: "Mode | None" = None):
        super().__init__(cache_dict, model, has_batch_dim=has_batch_dim)
        self.mode = mode

    def __getitem__(self, key):
        note = getattr(self.model, "note_cache_read", None)
        if self.mode is not None and note is not None:  # what the next hooked run reads (`check_cache_mode`)
            note(self, key)
        return super().__getitem__(key)

    def _input_label(self) -> str:
        cfg = self.model.cfg
        carries = False
        if self.mode is not None:
            T = self["blocks.0.hook_resid_pre"].shape[-2]
            carries = self.mode.first_fed_position(T) < T
        return "input" if carries or getattr(cfg, "nanochat_input", False) else "embed"

    def _check_sum(self, what: str, final: bool) -> None:
        cfg = self.model.cfg
        if getattr(cfg, "x0_mixing", False):
            raise FbtError(
                f"{what}: this model mixes block 0's input into every block (x0_mixing), so a block's "
                "input is not the sum of the earlier components; read blocks.{l}.hook_resid_mix instead"
            )
        if final and getattr(cfg, "backout_layer", None) is not None:
            raise FbtError(
                f"{what}: this model subtracts block {cfg.backout_layer}'s output before ln_final "
                "(backout_layer), so the final norm's input is hook_backout, not the sum of the components"
            )

    def apply_ln_to_stack(
        self,
        residual_stack,
        layer=None,
        mlp_input=False,
        pos_slice=None,
        batch_slice=None,
        has_batch_dim=True,
        recompute_ln=False,
    ):
        final = layer is None or layer in (-1, self.model.cfg.n_layers)
        self._check_sum("apply_ln_to_stack", final)
        if recompute_ln and final:  # TransformerLens's convention: the final gain lives in the unembedding
            if has_batch_dim and batch_slice is not None:
                batch_slice = batch_slice if isinstance(batch_slice, Slice) else Slice(batch_slice)
                residual_stack = batch_slice.apply(residual_stack, dim=1)
            return self.model.ln_final.normalize(residual_stack)
        return super().apply_ln_to_stack(
            residual_stack, layer, mlp_input, pos_slice, batch_slice, has_batch_dim, recompute_ln
        )

    def decompose_resid(
        self,
        layer=None,
        mlp_input=False,
        mode="all",
        apply_ln=False,
        pos_slice=None,
        incl_embeds=True,
        return_labels=False,
    ):
        """TransformerLens's `decompose_resid`, with the layer-0 input as the first component (see module doc)."""
        L = self.model.cfg.n_layers
        layer = L if layer is None or layer == -1 else layer
        self._check_sum("decompose_resid", layer == L)
        if layer > 0 or (mlp_input and mode != "mlp"):
            stack, labels = self._without_embed(
                super().decompose_resid, layer, mlp_input, mode, False, pos_slice, False, True
            )
        else:  # nothing before layer 0's attention but the input
            row = self._input_row(pos_slice)
            stack, labels = row.new_zeros(0, *row.shape[1:]), []
        if incl_embeds:
            stack = torch.cat([self._input_row(pos_slice), stack], dim=0)
            labels = [self._input_label(), *labels]
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice, mlp_input=mlp_input)
        return (stack, labels) if return_labels else stack

    def get_full_resid_decomposition(
        self,
        layer=None,
        mlp_input=False,
        expand_neurons=True,
        apply_ln=False,
        pos_slice=None,
        return_labels=False,
        project_output_onto=None,
    ):
        """TransformerLens's `get_full_resid_decomposition` (heads, neurons, input, bias), the
        input row being the layer-0 input (see module doc)."""
        L = self.model.cfg.n_layers
        layer = L if layer is None or layer == -1 else layer
        self._check_sum("get_full_resid_decomposition", layer == L)
        stack, labels = self._without_embed(
            super().get_full_resid_decomposition, layer, mlp_input, expand_neurons, False, pos_slice, True, None
        )
        at = labels.index("bias")
        stack = torch.cat([stack[:at], self._input_row(pos_slice), stack[at:]], dim=0)
        labels = [*labels[:at], self._input_label(), *labels[at:]]
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice, mlp_input=mlp_input)
        if project_output_onto is not None:
            stack = stack @ project_output_onto
        return (stack, labels) if return_labels else stack

    def _input_row(self, pos_slice) -> torch.Tensor:

        pos_slice = pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)
        return pos_slice.apply(self["blocks.0.hook_resid_pre"], dim=-2)[None]

    def _without_embed(self, fn, *args):
        has = self.has_embed, self.has_pos_embed
        self.has_embed = self.has_pos_embed = False
        try:
            return fn(*args)
        finally:
            self.has_embed, self.has_pos_embed = has


# TransformerLens hook names this model does not have, and what to use instead
ALTERNATIVES = {
    "hook_attn_in": "blocks.{l}.hook_resid_pre (what every head reads, before ln1) or blocks.{l}.ln1.hook_normalized",
    "hook_q_input": "blocks.{l}.ln1.hook_normalized (q, k and v read one normalised input) or attn.hook_q",
    "hook_k_input": "blocks.{l}.ln1.hook_normalized (q, k and v read one normalised input) or attn.hook_k",
    "hook_v_input": "blocks.{l}.ln1.hook_normalized (q, k and v read one normalised input) or attn.hook_v",
    "hook_pos_embed": "hook_embed (positions enter through RoPE: attn.hook_rot_q / hook_rot_k)",
}


class HookNames(dict):
    """`hook_dict` / `mod_dict` whose unknown names raise one line naming what to use instead."""

    def __missing__(self, name):
        leaf = str(name).rsplit(".", 1)[-1]
        layer = str(name).split(".")[1] if str(name).startswith("blocks.") else "l"
        hint = ALTERNATIVES.get(leaf)
        raise UnknownHook(
            f"hook '{name}': this model has no such hook point"
            + (f"; use {hint.replace('{l}', layer)}" if hint else " (fbt_probe.hooks.act_name builds the names)")
        )


class UnknownHook(FbtError, KeyError):
    """An unknown hook name (a KeyError, as TransformerLens's own lookup raises)."""

    def __str__(self) -> str:
        return self.format_message()


class TransformerLensSurface:
    """Mixin of `FeedbackTransformer`: TransformerLens's weight properties, tokenizer helpers and
    `generate` (see module doc). Needs `cfg`, `embed`, `blocks`, `ln_final` and `tokenizer`."""

    tokenizer = None  # a `tokenizers.Tokenizer`; checkpoint folders with a tokenizer.json set it on load

    def setup(self):
        """TransformerLens's setup, with the name tables answering unknown names in one line."""
        super().setup()
        self.mod_dict, self.hook_dict = HookNames(self.mod_dict), HookNames(self.hook_dict)

    # ------------------------------------------------------------------ weights
    @property
    def W_E(self) -> torch.Tensor:  # [d_vocab, d_model]
        return self.embed.weight

    @property
    def W_U(self) -> torch.Tensor:  # [d_model, d_vocab]
        """The unembedding with the final norm's gain folded in (TransformerLens's fold_ln): the logits
        are `ln_final.hook_normalized @ W_U` (the head's own matrix is `head_weight`)."""
        W = self.head_weight.t()
        gain = self.ln_final.weight
        return W if gain is None else W * gain[:, None]

    @property
    def b_U(self) -> torch.Tensor:
        return self.W_U.new_zeros(self.cfg.d_vocab)

    # the model has no biases: zeros in TransformerLens's shapes (as TL gives bias-free models)
    @property
    def b_Q(self) -> torch.Tensor:  # [n_layers, n_heads, d_head]
        return self.W_E.new_zeros(self.cfg.n_layers, self.cfg.n_heads, self.cfg.d_head)

    b_K = b_V = b_Q

    @property
    def b_O(self) -> torch.Tensor:  # [n_layers, d_model]
        return self.W_E.new_zeros(self.cfg.n_layers, self.cfg.d_model)

    b_out = b_O

    @property
    def b_in(self) -> torch.Tensor:  # [n_layers, d_mlp]
        return self.W_E.new_zeros(self.cfg.n_layers, self.cfg.d_mlp)

    def normalized_logits(self, normalized: torch.Tensor) -> torch.Tensor:
        """Logits of `ln_final.hook_normalized` [..., d_model]: the final gain, then the head (with
        whatever the family's head adds, e.g. soft-capping)."""
        gain = self.ln_final.weight
        return self.head(normalized if gain is None else normalized * gain)

    @property
    def unembed(self):
        """TransformerLens's `model.unembed(normalized)`: `normalized_logits`, or a family's own
        module of that name (nanochat's untied head) where it has one."""
        own = self._modules.get("unembed")
        return own if own is not None else self.normalized_logits

    def loss_fn(self, logits: torch.Tensor, tokens: torch.Tensor, attention_mask=None, per_token: bool = False):
        """TransformerLens's `loss_fn`: next-token cross-entropy of `logits` against `tokens` (mean, or
        [batch, pos - 1] with `per_token`; pad positions of `attention_mask` left out)."""
        mask = None if attention_mask is None else check_mask(attention_mask, tokens)
        return self._returned(logits, tokens, "loss", per_token, mask)

    def _stack(self, name: str) -> torch.Tensor:
        return torch.stack(
            [getattr(b.attn if name.endswith(("Q", "K", "V", "O")) else b.mlp, name) for b in self.blocks]
        )

    @property
    def W_Q(self) -> torch.Tensor:  # [n_layers, n_heads, d_model, d_head]
        return self._stack("W_Q")

    @property
    def W_K(self) -> torch.Tensor:  # [n_layers, n_heads, d_model, d_head]: each query head's KV head
        return self._stack("_W_K").repeat_interleave(self.cfg.n_heads // self.cfg.n_key_value_heads, dim=1)

    @property
    def W_V(self) -> torch.Tensor:  # [n_layers, n_heads, d_model, d_head]
        return self._stack("_W_V").repeat_interleave(self.cfg.n_heads // self.cfg.n_key_value_heads, dim=1)

    @property
    def W_O(self) -> torch.Tensor:  # [n_layers, n_heads, d_head, d_model], depth scaling included
        return self._stack("W_O")

    @property
    def W_in(self) -> torch.Tensor:  # [n_layers, d_model, d_mlp]
        return self._stack("W_in")

    @property
    def W_gate(self) -> torch.Tensor | None:  # [n_layers, d_model, d_mlp]; None for relu2 MLPs
        return None if self.blocks[0].mlp.gate_proj is None else self._stack("W_gate")

    @property
    def W_out(self) -> torch.Tensor:  # [n_layers, d_mlp, d_model], depth scaling included
        return self._stack("W_out")

    @property
    def QK(self) -> FactoredMatrix:
        """W_Q W_K^T per layer and head (before QK-norm and RoPE, which act between them)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        return FactoredMatrix(self.W_V, self.W_O)

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
        """Zero: the model has no biases (TransformerLens's cache methods add this row)."""
        return self.W_E.new_zeros(self.cfg.d_model)

    def tokens_to_residual_directions(self, tokens) -> torch.Tensor:
        """The direction d of each token with logit = (resid / scale) · d: W_U's column, the final
        gain folded in (so the cache's `logit_attrs` and the direct-logit idioms sum to the logits)."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        W = self.W_U
        if isinstance(tokens, torch.Tensor) and tokens.dim() > 0:
            return W[:, tokens].movedim(0, -1)
        return W[:, int(tokens)]

    # ------------------------------------------------------------------ tokenizer
    def _tok(self):
        if self.tokenizer is None:
            raise FbtError(
                "this model has no tokenizer: load a checkpoint folder holding tokenizer.json "
                "(e.g. ref:tiny-feedback), or set model.tokenizer = tokenizers.Tokenizer.from_file(...)"
            )
        return self.tokenizer

    def to_tokens(
        self,
        input,
        prepend_bos: bool | None = None,
        padding_side: str = "right",
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> torch.Tensor:
        """[batch, pos] token ids of a string or a list of strings (shorter rows padded with
        <pad> on `padding_side`). `prepend_bos` None: the tokenizer's own template, which prepends
        the BOS where the model was trained with one (a nanochat import's `<|bos|>`; the task
        tokenizer has none); True: that BOS, refused when the tokenizer has none; False: no BOS."""
        if padding_side not in ("right", "left"):
            raise FbtError(f"to_tokens: padding_side: expected 'right' or 'left', got {padding_side!r}")
        texts = [input] if isinstance(input, str) else list(input)
        tok = self._tok()
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=self._with_bos(tok, prepend_bos))]
        if truncate:
            ids = [row[: self.cfg.n_ctx] for row in ids]
        pad = tok.token_to_id("<pad>")
        pad = 0 if pad is None else pad
        width = max(len(row) for row in ids)
        rows = [
            row + [pad] * (width - len(row)) if padding_side == "right" else [pad] * (width - len(row)) + row
            for row in ids
        ]
        out = torch.tensor(rows, dtype=torch.long)
        out = out.to(self.W_E.device) if move_to_device else out
        if any(len(row) != width for row in ids):  # the model runs this batch's rows as their unpadded selves
            real = [[True] * len(row) + [False] * (width - len(row)) for row in ids]
            mask = torch.tensor([r if padding_side == "right" else r[::-1] for r in real], device=out.device)
            self.remember_padding(out, mask)
        return out

    @staticmethod
    def _with_bos(tok, prepend_bos: bool | None) -> bool:
        """Whether to encode with the tokenizer's template (its BOS); prepend_bos=True needs one."""
        if prepend_bos and len(tok.encode("", add_special_tokens=True).ids) != 1:
            raise FbtError("to_tokens: prepend_bos=True, but this model's tokenizer has no BOS token")
        return prepend_bos is not False

    def to_str_tokens(self, input, prepend_bos: bool | None = None):
        """The token strings: of a string (a list), a list of strings (a list of lists), or ids
        (a 1-D or [1, pos] tensor, or a list of ints)."""
        tok = self._tok()
        if isinstance(input, list) and input and isinstance(input[0], str):
            return [self.to_str_tokens(text, prepend_bos) for text in input]
        if isinstance(input, str):
            return tok.encode(input, add_special_tokens=self._with_bos(tok, prepend_bos)).tokens
        ids = torch.as_tensor(input)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise FbtError(f"to_str_tokens: expected one sequence, got a batch of shape {tuple(ids.shape)}")
            ids = ids[0]
        return [tok.id_to_token(int(i)) for i in ids.reshape(-1)]

    def to_string(self, tokens):
        """Text of token ids: a 1-D tensor gives a string, a [batch, pos] tensor a list of strings."""
        tok = self._tok()
        ids = torch.as_tensor(tokens)
        if ids.dim() == 2:
            return [tok.decode([int(i) for i in row], skip_special_tokens=False) for row in ids]
        return tok.decode([int(i) for i in ids.reshape(-1)], skip_special_tokens=False)

    def to_single_str_token(self, int_token: int) -> str:
        """The string of one token id (TransformerLens's)."""
        if isinstance(int_token, torch.Tensor):
            if int_token.numel() != 1:
                raise FbtError(f"to_single_str_token: expected one token id, got {int_token.numel()}")
            int_token = int(int_token.item())
        return self.to_str_tokens([int(int_token)])[0]

    def get_token_position(self, single_token, input, mode: str = "first", prepend_bos=None) -> int:
        """TransformerLens's: the position of `single_token` (a string of one token, or an id) in
        `input` (text, or ids of one sequence); `mode` "first" or "last"."""
        if mode not in ("first", "last"):
            raise FbtError(f"get_token_position: mode: expected 'first' or 'last', got {mode!r}")
        ids = self.to_tokens(input, prepend_bos=prepend_bos) if isinstance(input, str) else torch.as_tensor(input)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise FbtError(f"get_token_position: expected one sequence, got a batch of shape {tuple(ids.shape)}")
            ids = ids[0]
        tok = self.to_single_token(single_token) if isinstance(single_token, str) else int(single_token)
        where = (ids == tok).nonzero().flatten()
        if len(where) == 0:
            raise FbtError(f"get_token_position: token {single_token!r} is not in the input")
        return int(where[0] if mode == "first" else where[-1])

    def to_single_token(self, string: str) -> int:
        ids = self._tok().encode(string, add_special_tokens=False).ids
        if len(ids) != 1:
            raise FbtError(f"to_single_token: {string!r} is {len(ids)} tokens, not one")
        return ids[0]

    # ------------------------------------------------------------------ generation
    def _stopped_at_eos(self, new: torch.Tensor, eos: int | None) -> torch.Tensor:
        """TransformerLens's stop_at_eos for greedy decoding (rows are independent): every token after
        a row's first EOS becomes EOS, and the columns after the last row's EOS are dropped."""
        if eos is None:
            eos = None if self.tokenizer is None else _eos_id(self.tokenizer)
        if eos is None:
            raise FbtError("generate: stop_at_eos=True, but the tokenizer has no EOS token; pass eos_token_id=")
        hit = (new == eos).int().cummax(-1).values.bool()
        done = torch.cat([torch.zeros_like(hit[:, :1]), hit[:, :-1]], dim=1)  # after the first EOS
        new = new.masked_fill(done, eos)
        if bool(hit[:, -1].all()):
            new = new[:, : int(hit.int().argmax(-1).max()) + 1]
        return new

    def generate(
        self,
        input,
        max_new_tokens: int = 10,
        decoding: str = "std",
        do_sample: bool = False,
        return_type: str = "input",
        verbose: bool = False,
        stop_at_eos: bool = False,
        eos_token_id: int | None = None,
    ):
        """Greedy continuation under one of the paper's decodings (``std``, ``soft``, ``fused``;
        `fbt_probe.surface.decoding`). Like TransformerLens, returns the input followed by the new
        tokens: a string for a string input (`return_type="input"`, or ``"str"``), ids for ids
        (or ``"tokens"``)."""

        if do_sample:
            raise FbtError("generate: do_sample=True: only greedy decoding is implemented")
        if return_type not in ("input", "str", "tokens"):
            raise FbtError(f"generate: return_type: expected 'input', 'str' or 'tokens', got {return_type!r}")
        text = is_text(input)
        tokens = self.to_tokens(input) if text else input
        new = greedy(self, tokens, max_new_tokens, decoding)
        if stop_at_eos:
            new = self._stopped_at_eos(new, eos_token_id)
        out = torch.cat([tokens, new], dim=1)
        as_text = return_type == "str" or (return_type == "input" and text)
        if not as_text:
            return out
        strings = self.to_string(out)
        return strings[0] if isinstance(input, str) else strings


def _eos_id(tok) -> int | None:
    for name in ("<eos>", "<|eos|>", "</s>", "<|endoftext|>"):
        i = tok.token_to_id(name)
        if i is not None:
            return i
    return None


@contextlib.contextmanager
def without_wrappers(model):
    """Lift instance-level `forward` overrides (how nnsight instruments modules) for the block,
    so a hooks-off computation of carried states is invisible to such a wrapper; they come back after."""
    lifted = [(m, m.__dict__.pop("forward")) for m in model.modules() if "forward" in m.__dict__]
    try:
        yield
    finally:
        for m, fwd in lifted:
            m.__dict__["forward"] = fwd
