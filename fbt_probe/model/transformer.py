"""The latent-feedback transformer as a TransformerLens `HookedRootModule` (wiring only).

Hook rule (all modes): `model(tokens, mode=...)` computes the carried states first with hooks off,
then runs ONE hooked pass over the whole sequence whose inputs are exactly the mode's inputs (plain
e_t, or u_t = fusion(h_{t-1}, e_t) where a state is carried). Every hook therefore fires once with a
full [batch, pos, ...] tensor, `run_with_cache` / `run_with_hooks` behave as in TransformerLens, and
the activations at position t are those of the computation that produced position t's output: the
pass is exact, its top states at fed-back positions equal the carried states it was given. The
`fusion.*` hooks fire whenever the mode carries any state (not under `standard` or `jacobi:1`);
`fusion.hook_feedback` is zero at positions that take a plain embedding.

Calls that pass no mode (`model(tokens)`, `run_with_hooks`, `run_with_cache`, and TransformerLens
helpers such as `transformer_lens.patching`, which cannot pass one) run under `model.default_mode`
("standard" unless set): `with model.mode("recurrent:1"): ...` sets it for a block.

An intervention in that pass cannot reach carried states computed before it. For experiments whose
change must ripple forward through the feedback, call with `serial=True` (recurrent/full/jacobi):
hooks then fire in every chunk of the real computation — the standard prefix, then each serial step
([batch, 1, ...] tensors), or each Jacobi pass — and `model.hook_context` names the chunk
(`phase`, `positions`, `pass_index`) while its hooks run.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from fbt_probe.config import ModelConfig
from fbt_probe.engine import dispatch
from fbt_probe.engine.cache import KVCache
from fbt_probe.engine.graph_scan import GraphedScan
from fbt_probe.engine.hooks import Hk, HookContext, hooked, silent
from fbt_probe.engine.step import DecodePlan
from fbt_probe.errors import FbtError
from fbt_probe.model.components import Block, HookedRMSNorm
from fbt_probe.model.fusion import Fusion
from fbt_probe.modes import Mode, parse_mode, require_mode
from fbt_probe.surface.serial_cache import run_with_serial_cache
from fbt_probe.surface.tl_native import FeedbackActivationCache, TransformerLensSurface, is_text, without_wrappers
from fbt_probe.tokens import check_tokens

SILENT_CHUNK_TOKENS = 8192  # batch x positions per chunk of a silent pass through the KV cache (memory bound)


class FeedbackTransformer(TransformerLensSurface, HookedRootModule):
    """A decoder whose input can carry the previous position's top-layer state (docs/model.md).

    Parameters
    ----------
    cfg : ModelConfig
        Backbone shape and fusion settings (`fbt_probe.config.preset` builds the presets).

    Attributes
    ----------
    cfg : ModelConfig
        The config; `transformer_lens.patching` reads its TransformerLens-named fields.
    embed : torch.nn.Embedding
        Token embedding, tied to the output head.
    fusion : Fusion
        u_t = RMSNorm((W_U h_{t-1}) ⊙ σ(W_G e_t)), with hooks `fusion.hook_feedback|value|gate|out`.
    blocks : torch.nn.ModuleList
        The transformer blocks (hooks `blocks.{l}.*`).
    hook_context : HookContext or None
        While a hooked pass runs: which chunk it is and which global positions it holds.

    Examples
    --------
    >>> import torch
    >>> from fbt_probe.config import preset
    >>> model = FeedbackTransformer(preset("tiny", n_layers=2)).eval()
    >>> tokens = torch.tensor([[5, 6, 7, 8]])
    >>> logits, cache = model.run_with_cache(tokens, mode="recurrent:1")
    >>> logits.shape, cache["blocks.0.hook_resid_pre"].shape
    (torch.Size([1, 4, 128]), torch.Size([1, 4, 128]))
    """

    # A model family with extras (fbt_probe.formats.nanochat) subclasses these pieces and the
    # methods marked "a family may override"; `paper_backbone = False` keeps the engine's lean
    # serial step (which computes the paper's backbone only) off its models.
    fusion_cls = Fusion
    block_cls = Block
    paper_backbone = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)  # tied: also the unembedding
        self.hook_embed = HookPoint()  # [batch, pos, d_model]  plain token embedding e_t
        self.fusion = self.fusion_cls(cfg)
        self.blocks = nn.ModuleList(self.block_cls(cfg, l) for l in range(cfg.n_layers))
        self.ln_final = self.final_norm(cfg)  # hook_normalized: [batch, pos, d_model]
        self.add_extras()
        self.hook_context: HookContext | None = None
        self._default_mode = Mode("standard")
        self.cuda_graphs = True  # silent serial scans on CUDA replay one captured step (fbt_probe/engine/graph_scan.py)
        self.init_weights()
        self.setup()
        self.to(dtype=getattr(torch, cfg.dtype))

    # ----------------------------------------------------------------- parameters
    @staticmethod
    def final_norm(cfg: ModelConfig) -> HookedRMSNorm:
        return HookedRMSNorm(cfg.d_model, cfg.rms_eps)

    def add_extras(self) -> None:
        """Parameters and hook points a model family adds after the final norm (none here)."""

    @torch.no_grad()
    def init_weights(self) -> None:
        """Every matrix ~ N(0, init_std), in registration order; the fusion norm as `reset_fusion_norm`."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.cfg.init_std)
        self.reset_fusion_norm()

    @torch.no_grad()
    def reset_fusion_norm(self) -> None:
        """Fusion norm weight = `cfg.fusion_norm_init`, or (None) the mean RMS of the embedding rows
        (fused inputs start at embedding scale)."""
        init = self.cfg.fusion_norm_init
        if self.fusion.norm.weight is None:
            return
        rms = self.embed.weight.pow(2).mean(-1).sqrt().mean() if init is None else torch.tensor(float(init))
        self.fusion.norm.weight.copy_(rms.expand_as(self.fusion.norm.weight))

    # ----------------------------------------------------------------- default mode
    @property
    def default_mode(self) -> Mode:
        """The mode of calls that pass none (see module doc)."""
        return self._default_mode

    @default_mode.setter
    def default_mode(self, mode: "str | Mode") -> None:
        self._default_mode = parse_mode(mode)

    @contextlib.contextmanager
    def mode(self, mode: "str | Mode"):
        """`with model.mode("recurrent:1"): patching.get_act_patch_resid_pre(model, ...)`: every call
        without an explicit mode inside the block runs under `mode`; the old default comes back after."""
        old, self.default_mode = self._default_mode, mode
        try:
            yield self
        finally:
            self._default_mode = old

    def run_with_cache(self, *model_args, serial: bool = False, **kwargs):
        """TransformerLens's `run_with_cache`, returning an `ActivationCache` (a
        `FeedbackActivationCache`, see `fbt_probe.surface.tl_native`). With `serial=True` the hooks fire in every chunk of
        the serial computation and the chunks are stitched into [batch, pos, ...] (Jacobi: one entry
        per pass); see `fbt_probe.surface.serial_cache`."""
        if serial:
            return run_with_serial_cache(self, *model_args, **kwargs)
        remove_batch_dim = kwargs.get("remove_batch_dim", False)
        out, cache = super().run_with_cache(*model_args, **kwargs)
        mode = kwargs.get("mode", model_args[1] if len(model_args) > 1 else None)
        mode = self._default_mode if mode is None else parse_mode(mode)
        return out, FeedbackActivationCache(cache, self, has_batch_dim=not remove_batch_dim, mode=mode)

    # ----------------------------------------------------------------- primitives
    def _input(
        self,
        tokens: torch.Tensor,
        states: torch.Tensor | None,
        has_state: torch.Tensor | None,
        hk: Hk,
        start: int = 0,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """The layer-0 input of positions start..: the plain input, or the fused one where a state is carried."""
        e = hk(self.hook_embed, self.token_embedding(tokens))
        plain = self.plain_input(tokens, e, start, cache, hk)
        if states is None:
            return plain
        return self.fusion(states, e, has_state, hk, plain)

    def token_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """e_t: the looked-up embedding, what `hook_embed` holds and the fusion reads (a family may override)."""
        return self.embed(tokens)

    def plain_input(self, tokens: torch.Tensor, e: torch.Tensor, start: int, cache: KVCache | None, hk: Hk):
        """The layer-0 input of positions start.. where no state is carried: e itself (a family may override)."""
        return e

    def plain_inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """[batch, pos, d_model] the layer-0 input of every position without feedback (hooks off)."""
        return self._input(tokens, None, None, silent)

    def _trunk(
        self,
        x: torch.Tensor,
        start: int,
        cache: KVCache | None,
        hk: Hk,
        tokens: torch.Tensor | None = None,
        stop: int | None = None,
    ) -> torch.Tensor:
        """Blocks 0..stop-1 (default all) on the layer-0 input x (a family may override)."""
        for block in self.blocks if stop is None else self.blocks[:stop]:
            x = block(x, start, cache, hk, tokens)
        return x

    @property
    def head_weight(self) -> torch.Tensor:
        """[d_vocab, d_model] the unembedding: the tied embedding (a family may override)."""
        return self.embed.weight

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits of final-normed states [..., d_model] -> [..., d_vocab] (a family may override)."""
        return F.linear(normed, self.head_weight)

    def _top(self, h: torch.Tensor, hk: Hk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h^L -> (carried state, normed, logits)."""
        normed = self.ln_final(h, hk)
        logits = self.head(normed)
        state = h if self.cfg.feedback_source == "pre_norm" else normed
        if self.training and self.cfg.feedback_noise > 0:
            state = state + (torch.rand_like(state) * 2 - 1) * self.cfg.feedback_noise
        return state, normed, logits

    def _with_context(self, ctx: HookContext, fn, *args):
        self.hook_context = ctx
        try:
            return fn(*args)
        finally:
            self.hook_context = None

    def extend(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        states: torch.Tensor | None = None,
        has_state: torch.Tensor | None = None,
        hk: Hk = silent,
    ):
        """Run `tokens` [batch, pos] at positions cache.length.. through the KV cache (written in
        place), plain or fused inputs (`has_state` None with states: every position is fused).
        Returns (carried state [batch, pos, d_model], logits [batch, pos, d_vocab]).

        With hooks off a long `tokens` runs in chunks of about SILENT_CHUNK_TOKENS tokens through
        the cache: the same function (up to float rounding), with activations held for one chunk."""
        B, P = tokens.shape
        size = max(1, SILENT_CHUNK_TOKENS // max(B, 1))
        if hk is silent and P > size:
            parts = [
                self.extend(
                    tokens[:, a : a + size],
                    cache,
                    None if states is None else states[:, a : a + size],
                    None if has_state is None else has_state[..., a : a + size],
                    hk,
                )
                for a in range(0, P, size)
            ]
            return torch.cat([s for s, _ in parts], dim=1), torch.cat([lg for _, lg in parts], dim=1)
        start = cache.length
        x = self._input(tokens, states, has_state, hk, start, cache)
        h = self._trunk(x, start, cache, hk, tokens)
        state, _, logits = self._top(h, hk)
        return state, logits

    def prefill_cache(
        self,
        tokens: torch.Tensor,
        states: torch.Tensor | None = None,
        has_state: torch.Tensor | None = None,
        hk: Hk = silent,
        capacity: int | None = None,
    ):
        """One pass over `tokens` (plain or fused inputs) that fills a new KV cache of `capacity`
        positions (default: the prompt; it grows if a step passes it).
        Returns (cache, carried state [batch, pos, d_model], logits [batch, pos, d_vocab])."""
        cache = KVCache(self.cfg.n_layers, capacity or tokens.shape[1])
        state, logits = self.extend(tokens, cache, states, has_state, hk)
        return cache, state, logits

    def decode_plan(self) -> DecodePlan | None:
        """The lean serial step for silent steps of this model as its weights are now, or None
        where the module path must run (`fbt_probe.engine.dispatch.step`)."""
        return DecodePlan(self) if dispatch.step(self) == "plan" else None

    def step(
        self,
        token: torch.Tensor,
        cache: KVCache,
        state: torch.Tensor | None,
        hk: Hk = silent,
        plan: DecodePlan | None = None,
    ):
        """One position with the KV cache. token: [batch]; state: [batch, d_model] carried from the
        previous position, or None for a plain embedding. Returns (logits [batch, d_vocab], state).
        With hooks off the step takes `plan` (default: `decode_plan()`) where one applies."""
        if hk is silent:
            plan = plan or self.decode_plan()
            if plan is not None:
                return plan.step(token, cache, state)
        fed = None if state is None else state[:, None, :]
        new_state, logits = self.extend(token[:, None], cache, fed, None, hk)
        return logits[:, 0], new_state[:, 0]

    @staticmethod
    def shift_states(state: torch.Tensor) -> torch.Tensor:
        """Right-shift carried states by one position (position 0 gets zeros: no state)."""
        return torch.cat([torch.zeros_like(state[:, :1]), state[:, :-1]], dim=1)

    # ----------------------------------------------------------------- modes
    def feedback_pass(
        self,
        tokens: torch.Tensor,
        states: torch.Tensor | None = None,
        has_state: torch.Tensor | None = None,
        hk: Hk = silent,
    ):
        """One parallel pass over the whole sequence with the given carried states (None: standard).
        Returns (this pass's carried state [batch, pos, d_model] before shifting, logits)."""
        h = self._trunk(self._input(tokens, states, has_state, hk), 0, None, hk, tokens)
        state, _, logits = self._top(h, hk)
        return state, logits

    def jacobi_passes(
        self, tokens: torch.Tensor, K: int, serial_hooks: bool = False, has_state: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Logits of every pass 1..K of `jacobi:K` (training uses all of them, eq. 12).
        Hooks fire only in pass K unless `serial_hooks` (then in every pass, with `hook_context`).
        `has_state` ([pos] or [batch, pos]) limits which positions take the carried state (default
        every position >= 1; training's prefix mixin keeps a prompt prefix plain)."""
        T = tokens.shape[1]
        has = torch.arange(T, device=tokens.device) >= 1 if has_state is None else has_state
        states, out = None, []
        for k in range(1, K + 1):
            hk = hooked if (k == K or serial_hooks) else silent
            ctx = HookContext("pass" if serial_hooks else "final", range(T), k) if hk is hooked else None
            state, logits = self._with_context(
                ctx, self.feedback_pass, tokens, states, None if states is None else has, hk
            )
            out.append(logits)
            states = self.shift_states(state)
        return out

    def serial_scan(self, tokens: torch.Tensor, n_serial: int, hooks: bool = False, stop: int | None = None):
        """Positions 0..stop-1 (default all) of the exact recurrence over the last `n_serial`
        positions: a standard prefill of positions < P = T - n_serial, then one KV-cache step per
        position, each fused with the previous position's top state. Returns (cache of capacity T
        holding positions < stop, carried states [batch, T, d_model] (zeros where none or not
        reached), logits [batch, stop, d_vocab], top state of position stop-1 [batch, d_model])."""
        B, T = tokens.shape
        stop = T if stop is None else stop
        P = min(T - n_serial, stop)
        hk = hooked if hooks else silent
        cache = KVCache(self.cfg.n_layers, T)
        ctx = HookContext("prefix", range(P)) if hooks else None
        state, logits = self._with_context(ctx, self.extend, tokens[:, :P], cache, None, None, hk)
        prev = state[:, -1]
        carried = state.new_zeros(B, T, state.shape[-1])
        out = logits.new_empty(B, stop, logits.shape[-1])
        out[:, :P] = logits
        plan = None if hooks else self.decode_plan()  # the weights are fixed for the whole scan
        if dispatch.scan(plan is not None, self.cuda_graphs, cache, tokens, P, stop - P) == "graphed":
            scan = GraphedScan(plan, cache, tokens, carried, out, prev, P, fused_epilogue=self.cfg.fast_fusion)
            prev = scan.run(stop - P)
            return cache, carried, out, prev
        for t in range(P, stop):
            carried[:, t] = prev
            if plan is not None:
                out[:, t], prev = plan.step(tokens[:, t], cache, prev)
                continue
            ctx = HookContext("step", range(t, t + 1)) if hooks else None
            out[:, t], prev = self._with_context(ctx, self.step, tokens[:, t], cache, prev, hk)
        return cache, carried, out, prev

    def serial_states(self, tokens: torch.Tensor, n_serial: int, hooks: bool = False):
        """The exact recurrence over the last `n_serial` positions (standard prefix before them).
        Returns (carried states [batch, pos, d_model] with zeros where none, has_state [pos], logits)."""
        T = tokens.shape[1]
        _, states, logits, _ = self.serial_scan(tokens, n_serial, hooks)
        return states, torch.arange(T, device=tokens.device) >= T - n_serial, logits

    def carried_states(self, tokens: torch.Tensor, mode: Mode):
        """(states, has_state) that `mode` feeds into its final pass; (None, None) for no feedback.
        Module-level `forward` wrappers (nnsight's) are lifted meanwhile: they see the final pass only."""
        with without_wrappers(self):
            return self._carried_states(tokens, mode)

    def _carried_states(self, tokens: torch.Tensor, mode: Mode):
        require_mode(mode)
        T = tokens.shape[1]
        mode.check_length(T)
        if mode.first_fed_position(T) >= T:
            return None, None
        if mode.kind == "jacobi" and mode.k < T:
            return self._jacobi_states(tokens, mode.passes(T)), torch.arange(T, device=tokens.device) >= 1
        if (
            mode.kind == "jacobi"
        ):  # K >= T: jacobi:T = full, whose serial scan is T steps, not T passes over T positions
            mode = Mode("full")
        # the final position's own step would only produce the state carried out of the sequence
        _, states, _, last = self.serial_scan(tokens, mode.n_serial(T), stop=T - 1)
        states[:, T - 1] = last
        return states, torch.arange(T, device=tokens.device) >= mode.first_fed_position(T)

    def _jacobi_states(self, tokens: torch.Tensor, K: int) -> torch.Tensor:
        has, states = torch.arange(tokens.shape[1], device=tokens.device) >= 1, None
        for _ in range(K - 1):
            states = self.shift_states(self.feedback_pass(tokens, states, None if states is None else has)[0])
        return states

    def forward(
        self,
        tokens: torch.Tensor,
        mode: "str | Mode | None" = None,
        serial: bool = False,
        stop_at_layer: int | None = None,
        return_type: str | None = "logits",
        prepend_bos: bool | None = None,
    ) -> torch.Tensor:
        """Logits of `tokens` under a prefill mode (docs/modes.md).

        Parameters
        ----------
        tokens : torch.LongTensor, str or list of str
            [batch, pos] token ids (text goes through `to_tokens`, with `prepend_bos`).
        mode : str or Mode, optional
            ``standard``, ``recurrent:k``, ``full`` or ``jacobi:K`` (None: `self.default_mode`).
            ``jacobi:K`` runs min(K, T) passes; for K >= T the answer is the exact recurrence
            (``jacobi:T`` = ``full``), computed by the serial scan of ``full`` when hooks fire once.
        serial : bool, default False
            Where hooks fire. False: once, in one final pass over the whole sequence whose inputs are
            the mode's (carried states computed before it with hooks off), so an edit there does not
            reach later positions' inputs through the feedback. True: in every chunk of the real
            computation (the standard prefix, then each step, `self.hook_context` naming the
            positions), so a patch at position t reaches t+1's input. The logits are the same.
        stop_at_layer : int, optional
            TransformerLens's: run the analysed pass through blocks 0..stop_at_layer-1 only and
            return the residual stream there ([batch, pos, d_model]; negative counts from the top).
            The carried states a feedback mode feeds in still come from the whole model.
        return_type : {"logits", "loss", "both", None}
            TransformerLens's: the logits, the mean next-token cross-entropy, (logits, loss), or None.

        Returns
        -------
        torch.Tensor
            [batch, pos, d_vocab] logits (see `return_type`, `stop_at_layer`).

        Examples
        --------
        >>> import torch
        >>> from fbt_probe.config import preset
        >>> model = FeedbackTransformer(preset("tiny", n_layers=2, dtype="float64")).eval()
        >>> tokens = torch.tensor([[5, 6, 7, 8]])
        >>> full = model(tokens, mode="full")
        >>> full.shape
        torch.Size([1, 4, 128])
        >>> torch.allclose(full, model(tokens, mode="jacobi:4"))  # T Jacobi passes are the exact recurrence
        True
        >>> torch.allclose(full, model(tokens, mode="full", serial=True))
        True
        """
        if is_text(tokens):
            tokens = self.to_tokens(tokens, prepend_bos=prepend_bos)
        tokens = check_tokens(tokens, self.cfg)
        mode = self._default_mode if mode is None else parse_mode(mode)
        if return_type not in ("logits", "loss", "both", None):
            raise FbtError(f"return_type: expected 'logits', 'loss', 'both' or None, got {return_type!r}")
        T = tokens.shape[1]
        mode.check_length(T)
        if stop_at_layer is not None:
            return self._stopped(tokens, mode, serial, stop_at_layer)
        if serial and mode.kind == "jacobi":
            logits = self.jacobi_passes(tokens, mode.passes(T), serial_hooks=True)[-1]
        elif serial and mode.kind in ("recurrent", "full"):
            logits = self.serial_states(tokens, mode.n_serial(T), hooks=True)[2]
        else:
            states, has = self.carried_states(tokens, mode)
            ctx = HookContext("final", range(T), mode.passes(T))
            logits = self._with_context(ctx, self.feedback_pass, tokens, states, has, hooked)[1]
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if T < 2:
            raise FbtError("return_type: the next-token loss needs at least 2 positions")
        flat = logits[:, :-1].flatten(0, 1)
        loss = F.cross_entropy(
            flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat, tokens[:, 1:].flatten()
        )
        return loss if return_type == "loss" else (logits, loss)

    def _stopped(self, tokens: torch.Tensor, mode: Mode, serial: bool, stop_at_layer) -> torch.Tensor:
        """The analysed pass through blocks 0..stop-1: the residual stream there."""
        L = self.cfg.n_layers
        if isinstance(stop_at_layer, bool) or not isinstance(stop_at_layer, int) or not -L <= stop_at_layer <= L:
            raise FbtError(f"stop_at_layer: expected an integer in [{-L}, {L}], got {stop_at_layer!r}")
        if serial:
            raise FbtError(
                "stop_at_layer: not with serial=True (every serial step needs the top layer's state); "
                "cache the final pass (serial=False), whose layers below the stop are the same"
            )
        stop = stop_at_layer if stop_at_layer >= 0 else L + stop_at_layer
        T = tokens.shape[1]
        states, has = self.carried_states(tokens, mode)

        def run():
            return self._trunk(self._input(tokens, states, has, hooked), 0, None, hooked, tokens, stop=stop)

        return self._with_context(HookContext("final", range(T), mode.passes(T)), run)
