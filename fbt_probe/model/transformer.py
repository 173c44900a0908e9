"""The latent-feedback transformer as a TransformerLens `HookedRootModule` (wiring only).

`model(tokens, mode=...)` is one walk (`fbt_probe.engine.walk`) of the mode's chunks under the call's
hook rule (`hook_rule`, docs/modes.md): the exact rule (the default with hooks attached: every hook
fires once per pass of the mode's exact iteration, so an edit reaches the carried states), the
one-pass rule (carried states computed with hooks off, then one hooked pass whose top states at
fed-back positions equal them) or the serial rule (`serial=True`: hooks in every chunk of the
serial computation, `hook_context` naming it). Every rule gives the same logits, and the `fusion.*`
hooks fire wherever the mode carries a state (`fusion.hook_feedback` is zero at plain positions).
Calls that pass no mode (`run_with_hooks`, `run_with_cache`, `transformer_lens.patching`) run
under `model.default_mode` ("standard" unless set; `with model.mode("recurrent:1"): ...`).
"""

from __future__ import annotations

import contextlib
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from fbt_probe.config import ModelConfig
from fbt_probe.engine.fast import GradTaps, Hk, HookContext, KVCache, Schedule, has_hooks, hooked, silent, walk
from fbt_probe.errors import FbtError
from fbt_probe.model.components import Block, HookedRMSNorm
from fbt_probe.model.fusion import Fusion
from fbt_probe.modes import Mode, parse_mode, require_mode
from fbt_probe.numerics import upcast
from fbt_probe.surface.serial_cache import run_with_serial_cache
from fbt_probe.surface.tl_native import FeedbackActivationCache, TransformerLensSurface, is_text, without_wrappers
from fbt_probe.tokens import check_mask, check_tokens

EXACT_PASS_LIMIT = 256  # passes the exact hook rule runs at most (each a hooked pass over the whole sequence)


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
        self._running_mode: Mode | None = None  # the mode of the call whose hooks are running
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

    def run_with_cache(self, *model_args, serial: bool | None = None, **kwargs):
        """TransformerLens's `run_with_cache`, returning an `ActivationCache` (a
        `FeedbackActivationCache`, see `fbt_probe.surface.tl_native`). With `serial=True` the hooks fire in every chunk of
        the serial computation and the chunks are stitched into [batch, pos, ...] (Jacobi: one entry
        per pass); see `fbt_probe.surface.serial_cache`."""
        if serial:
            return run_with_serial_cache(self, *model_args, **kwargs)
        if serial is False or not (kwargs.get("incl_bwd") or self.hooks_attached()):
            kwargs["serial"] = False  # the cache's hooks only read: the one pass holds the mode's activations
            self.__dict__.pop("_cache_read", None)  # and no patch reads another cache
        remove_batch_dim = kwargs.get("remove_batch_dim", False)
        out, cache = super().run_with_cache(*model_args, **kwargs)
        mode = kwargs.get("mode", model_args[1] if len(model_args) > 1 else None)
        mode = self._default_mode if mode is None else parse_mode(mode)
        return out, FeedbackActivationCache(cache, self, has_batch_dim=not remove_batch_dim, mode=mode)

    # ----------------------------------------------------------------- primitives (engine.walk.Primitives)
    def embed_fuse(
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
        return self.embed_fuse(tokens, None, None, silent)

    def trunk(
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

    def top(self, h: torch.Tensor, hk: Hk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h^L -> (carried state, normed, logits)."""
        normed = self.ln_final(h, hk)
        logits = self.head(normed)
        state = h if self.cfg.feedback_source == "pre_norm" else normed
        if self.training and self.cfg.feedback_noise > 0:
            state = state + (torch.rand_like(state) * 2 - 1) * self.cfg.feedback_noise
        return state, normed, logits

    def extend(self, tokens: torch.Tensor, cache: KVCache, states=None, has_state=None, hk: Hk = silent):
        """Run `tokens` [batch, pos] at positions cache.length.. through the KV cache (written in
        place), plain or fused inputs (`has_state` None with states: every position is fused).
        Returns (carried state [batch, pos, d_model], logits [batch, pos, d_vocab]).

        With hooks off a long `tokens` runs in chunks through the cache (`fbt_probe.engine.walk.extend`)."""
        return walk.extend(self, tokens, cache, states, has_state, hk)

    def prefill_cache(self, tokens: torch.Tensor, states=None, has_state=None, hk: Hk = silent, capacity=None):
        """One pass over `tokens` (plain or fused inputs) that fills a new KV cache of `capacity`
        positions (default: the prompt; it grows if a step passes it).
        Returns (cache, carried state [batch, pos, d_model], logits [batch, pos, d_vocab])."""
        cache = KVCache(self.cfg.n_layers, capacity or tokens.shape[1])
        state, logits = self.extend(tokens, cache, states, has_state, hk)
        return cache, state, logits

    def step(self, token: torch.Tensor, cache: KVCache, state: torch.Tensor | None, hk: Hk = silent):
        """One position with the KV cache. token: [batch]; state: [batch, d_model] carried from the
        previous position, or None for a plain embedding. Returns (logits [batch, d_vocab], state).
        With hooks off the engine's lean step runs where it applies (`fbt_probe.engine.walk.step`)."""
        return walk.step(self, token, cache, state, hk)

    shift_states = staticmethod(walk.shift)  # right-shift carried states by one position (zeros into position 0)

    # ----------------------------------------------------------------- modes (each a walk, fbt_probe.engine.walk)
    def feedback_pass(self, tokens: torch.Tensor, states=None, has_state=None, hk: Hk = silent):
        """One parallel pass over the whole sequence with the given carried states (None: standard).
        Returns (this pass's carried state [batch, pos, d_model] before shifting, logits)."""
        return walk.run_pass(self, tokens, states, has_state, hk)

    def jacobi_passes(
        self, tokens: torch.Tensor, K: int, serial_hooks: bool = False, has_state: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Logits of every pass 1..K of `jacobi:K` (training uses all of them, eq. 12).
        Hooks fire only in pass K unless `serial_hooks` (then in every pass, with `hook_context`).
        `has_state` ([pos] or [batch, pos]) limits which positions take the carried state (default
        every position >= 1; training's prefix mixin keeps a prompt prefix plain)."""
        out = []
        walk.passes(self, tokens, K, every=serial_hooks, has=has_state, each=lambda c, s, logits, p: out.append(logits))
        return out

    def recurrence_logits(self, tokens: torch.Tensor, has_state: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the exact recurrence (`full`, = the last of T Jacobi passes) by its serial scan,
        hooks off, with `has_state` as `jacobi_passes`'s (training's `full` schedule)."""
        return walk.recurrence(self, tokens, has_state).logits

    def carried_states(self, tokens: torch.Tensor, mode: Mode):
        """(states, has_state) that `mode` feeds into its final pass; (None, None) for no feedback.
        Module-level `forward` wrappers (nnsight's) are lifted meanwhile: they see the final pass only."""
        with without_wrappers(self):
            return walk.carried_states(self, tokens, require_mode(mode))[:2]

    def forward(
        self,
        tokens: torch.Tensor,
        mode: "str | Mode | None" = None,
        serial: bool | None = None,
        stop_at_layer: int | None = None,
        return_type: str | None = "logits",
        prepend_bos: bool | None = None,
        *,
        padding_side: str | None = None,
        attention_mask: torch.Tensor | None = None,
        loss_per_token: bool = False,
        start_at_layer: int | None = None,
    ) -> torch.Tensor:
        """Logits of `tokens` under a prefill mode (docs/modes.md).

        Parameters
        ----------
        tokens : torch.LongTensor, str or list of str
            [batch, pos] token ids (text goes through `to_tokens`, with `prepend_bos` and
            `padding_side`); with `start_at_layer`, the residual stream [batch, pos, d_model] there.
        mode : str or Mode, optional
            ``standard``, ``recurrent:k``, ``full`` or ``jacobi:K`` (None: `self.default_mode`).
            ``jacobi:K`` runs min(K, T) passes; for K >= T the answer is the exact recurrence
            (``jacobi:T`` = ``full``), computed by the serial scan of ``full`` when hooks fire once.
        serial : bool or None, default None
            The hook rule (docs/modes.md, "The hook rule"); the logits are the same under each. None:
            the exact rule where the mode carries a state and a hook is attached (hooks fire once per
            pass of the mode's exact iteration: an edit reaches the carried states, backward hooks get
            the whole gradient), else the one pass. False: one final pass, its carried states computed
            with hooks off. True: hooks fire in every chunk of the serial computation (`hook_context`).
        stop_at_layer : int, optional
            TransformerLens's: run the analysed pass through blocks 0..stop_at_layer-1 only and
            return the residual stream there ([batch, pos, d_model]; negative counts from the top).
            The carried states a feedback mode feeds in still come from the whole model.
        return_type : {"logits", "loss", "both", None}
            TransformerLens's: the logits, the mean next-token cross-entropy, (logits, loss), or None.
        padding_side : {"right", "left"}, optional
            For text input: where `to_tokens` pads shorter rows.
        attention_mask : torch.Tensor, optional
            [batch, pos], 1 at real tokens: rows padded on the left or right run as their unpadded
            selves (pad positions get zero logits). Batches made by `to_tokens` carry their mask.
        loss_per_token : bool, default False
            TransformerLens's: the loss per position [batch, pos - 1] instead of the mean.
        start_at_layer : int, optional
            TransformerLens's: `tokens` is the residual stream at the input of block
            `start_at_layer`; only where the mode carries no state (a state needs the whole model).

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
            side = "right" if padding_side is None else padding_side
            tokens = self.to_tokens(tokens, prepend_bos=prepend_bos, padding_side=side)
        mode = self._default_mode if mode is None else parse_mode(mode)
        if return_type not in ("logits", "loss", "both", None):
            raise FbtError(f"return_type: expected 'logits', 'loss', 'both' or None, got {return_type!r}")
        if start_at_layer is not None:
            return self._started(tokens, mode, start_at_layer, stop_at_layer, return_type)
        return self._forward_ids(tokens, mode, serial, stop_at_layer, return_type, loss_per_token, attention_mask)

    def _forward_ids(self, tokens, mode: Mode, serial, stop_at_layer, return_type, loss_per_token, attention_mask):
        """`forward` on token ids: a padded batch row by row, else the mode's computation under its hook rule."""
        tokens = check_tokens(tokens, self.cfg)
        T = tokens.shape[1]
        mode.check_length(T)
        mask = attention_mask if attention_mask is not None else self.padding_of(tokens)
        if mask is not None:
            mask = check_mask(mask, tokens)
            if not bool(mask.all()):
                return self._padded(tokens, mask, mode, serial, stop_at_layer, return_type, loss_per_token)
        rule = self.hook_rule(mode, T, serial)
        self.check_cache_mode(mode)
        self._running_mode = mode
        try:
            out = self._run(tokens, mode, rule, stop_at_layer)
        finally:
            self._running_mode = None
            self.__dict__.pop("_cache_read", None)
        return out if stop_at_layer is not None else self._returned(out, tokens, return_type, loss_per_token, None)

    def hooks_attached(self) -> bool:
        """Whether any TransformerLens hook (forward or backward) is attached to a hook point, or a
        module is spliced in where a hook point was (an SAE, `fbt_probe.sae.hooked`)."""
        return bool(self._editors() or self._backward_hooked())

    def _editors(self) -> list[str]:
        """Hook points with a forward hook, and modules spliced in at a hook point: what can edit a pass."""
        out = [n for n, hp in self.hook_dict.items() if hp._forward_hooks or hp._forward_pre_hooks]
        return out + [n for n, m in self.mod_dict.items() if "always_hooked" in m.__dict__]

    def _backward_hooked(self) -> list[str]:
        """Hook points with a backward hook."""
        return [n for n, hp in self.hook_dict.items() if hp._backward_hooks]

    def note_cache_read(self, cache, key) -> None:
        """A `FeedbackActivationCache` was read: the next hooked run checks that its mode is the cache's."""
        self.__dict__["_cache_read"] = (weakref.ref(cache), str(key))
        if self._running_mode is not None:  # read inside a hook of this run
            self.check_cache_mode(self._running_mode)

    def check_cache_mode(self, mode: Mode) -> None:
        """Warn once per cache and mode when a hooked run under `mode` follows a read of a cache made
        under another mode (TransformerLens's patching reads the clean cache just before each run)."""
        read = self.__dict__.pop("_cache_read", None)
        cache = None if read is None else read[0]()
        if cache is None or cache.mode is None or cache.mode == mode or not self.hooks_attached():
            return
        warned = self.__dict__.setdefault("_cache_mode_warned", set())
        if (id(cache), mode) not in warned:
            warned.add((id(cache), mode))
            warnings.warn(
                f"{read[1]}: read from a cache made under '{cache.mode}' for a hooked run under '{mode}'; "
                f"run under model.mode('{cache.mode}') to patch like with like",
                stacklevel=4,
            )

    def hook_rule(self, mode: Mode, T: int, serial: bool | None) -> str:
        """Which hook rule a call runs under: "serial", "one-pass" or "exact" (see `forward`)."""
        if serial:
            return "serial"
        if mode.first_fed_position(T) >= T:  # nothing carried: the one pass is the whole computation
            return "one-pass"
        backward = self._backward_hooked()
        if serial is None:
            if not (backward or self._editors()):
                return "one-pass"
            if mode.exact_passes(T) > EXACT_PASS_LIMIT:
                raise FbtError(
                    f"hooks under '{mode}' on {T} tokens: the exact hook rule would run {mode.exact_passes(T)} "
                    f"hooked passes (at most {EXACT_PASS_LIMIT}); pass serial=True (the same edits, hooks per "
                    "serial step with model.hook_context) or serial=False (one pass; edits do not reach the carried state)"
                )
            return "exact"
        if backward:
            raise FbtError(
                f"backward hooks on {backward[0]} under '{mode}' with serial=False: the one pass's gradient "
                "misses the path through the carried state; leave serial unset (the exact rule)"
            )
        return "one-pass"

    def _run(self, tokens: torch.Tensor, mode: Mode, rule: str, stop_at_layer=None) -> torch.Tensor:
        """The mode's computation under the hook `rule`, one walk of its chunks: the logits, or with
        `stop_at_layer` the residual stream at that block's input in the analysed (last) pass.

        The exact rule runs `mode.exact_passes(T)` hooked parallel passes, each fed the previous
        pass's top states at the mode's fed positions: pass k makes the k-th fed position exact, so
        the last pass is the mode's computation, and a position-wise edit made by a hook in every
        pass is the serial run's edit. Backward hooks fire once with the summed gradient (`GradTaps`)."""
        stop = None if stop_at_layer is None else self._layer_index("stop_at_layer", stop_at_layer)
        if stop is not None and rule == "serial":
            raise FbtError(
                "stop_at_layer: not with serial=True (every serial step needs the top layer's state); "
                "cache the final pass (serial=False), whose layers below the stop are the same"
            )
        sched = Schedule(mode, tokens.shape[1])
        has = sched.has_state(tokens.device)
        if rule == "serial":
            w = walk.Walk(self, tokens, has=has).run(sched.serial())
        elif rule == "exact":
            with GradTaps(self.hook_dict.values(), self, sched.backward().context()) as taps:
                w = walk.Walk(self, tokens, taps.hk, has=has).run(sched.exact(), stop)
        else:
            states = self.carried_states(tokens, mode)[0]
            w = walk.Walk(self, tokens, has=has, states=states).run([sched.final()], stop)
        return w.logits if stop is None else w.top

    def _returned(self, logits, tokens, return_type, loss_per_token, mask):
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if tokens.shape[1] < 2:
            raise FbtError("return_type: the next-token loss needs at least 2 positions")
        flat = upcast(logits[:, :-1])
        per = F.cross_entropy(flat.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none").view(tokens.shape[0], -1)
        if mask is not None:  # a position counts where it and its target are real tokens
            keep = (mask[:, :-1] & mask[:, 1:]).to(per.dtype)
            per = per * keep
            loss = per if loss_per_token else per.sum() / keep.sum().clamp(min=1)
        else:
            loss = per if loss_per_token else per.mean()
        return loss if return_type == "loss" else (logits, loss)

    def _padded(self, tokens, mask, mode, serial, stop_at_layer, return_type, loss_per_token):
        """A padded batch, each row run as its unpadded self (rows of one length and offset together)."""
        attached = [hp.name for hp in self.hook_dict.values() if has_hooks(hp)]
        if attached or stop_at_layer is not None:
            what = f"a hook on {attached[0]}" if attached else "stop_at_layer"
            raise FbtError(
                f"padded batch with {what}: hook tensors would mix the rows' pad positions into the mode's "
                "computation; run rows of one length together (model.to_tokens(text) per length)"
            )
        B, T = tokens.shape
        starts = mask.int().argmax(-1)
        lengths = mask.sum(-1)
        logits = None
        for a, n in sorted({(int(a), int(n)) for a, n in zip(starts, lengths)}):
            rows = ((starts == a) & (lengths == n)).nonzero().flatten()
            part = self.forward(tokens[rows, a : a + n], mode=mode, serial=serial)
            if logits is None:
                logits = part.new_zeros(B, T, part.shape[-1])
            logits[rows, a : a + n] = part
        return self._returned(logits, tokens, return_type, loss_per_token, mask)

    def padding_of(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """The attention mask `to_tokens` made with this very tensor (None for any other)."""
        entry = self.__dict__.get("_padded_batches", {}).get(id(tokens))
        return entry[1] if entry is not None and entry[0]() is tokens else None

    def remember_padding(self, tokens: torch.Tensor, mask: torch.Tensor) -> None:
        """Record that `tokens` is a padded batch with `mask` (what `forward` reads back)."""
        book = self.__dict__.setdefault("_padded_batches", {})
        for key in [k for k, (ref, _) in book.items() if ref() is None]:
            del book[key]
        book[id(tokens)] = (weakref.ref(tokens), mask)

    def _started(self, x, mode, start_at_layer, stop_at_layer, return_type):
        """TransformerLens's start_at_layer: blocks start..stop-1 (then the top) on the stream x."""
        a = self._layer_index("start_at_layer", start_at_layer)
        stop = self.cfg.n_layers if stop_at_layer is None else self._layer_index("stop_at_layer", stop_at_layer)
        if not torch.is_tensor(x) or x.dim() != 3 or x.shape[-1] != self.cfg.d_model or not x.is_floating_point():
            raise FbtError(f"start_at_layer: expected the residual stream [batch, pos, {self.cfg.d_model}] as input")
        T = x.shape[1]
        if mode.first_fed_position(T) < T:
            raise FbtError(
                f"start_at_layer under '{mode}': a carried state needs the whole model from the tokens; run "
                "model(tokens) with a hook on blocks.{l}.hook_resid_pre that writes the stream"
            )
        if return_type in ("loss", "both"):
            raise FbtError("start_at_layer: return_type 'loss' needs the tokens; use 'logits'")
        h = x
        for block in self.blocks[a:stop]:
            h = block(h, 0, None, hooked, None)
        if stop_at_layer is not None:
            return h
        return None if return_type is None else self.top(h, hooked)[2]

    def _layer_index(self, name: str, value) -> int:
        """A TransformerLens layer argument in 0..L (negative counts from the top), or one line."""
        L = self.cfg.n_layers
        if isinstance(value, bool) or not isinstance(value, int) or not -L <= value <= L:
            raise FbtError(f"{name}: expected an integer in [{-L}, {L}], got {value!r}")
        return value if value >= 0 else L + value
