"""Hidden Decoding (multi-stream token expansion, docs/hidden-decoding.md) on the fbt-probe backbone.

    from fbt_probe.hidden import HiddenDecodingTransformer, stream_position
    hd = HiddenDecodingTransformer.from_base(base_model, n_streams=4)   # warm start
    logits = hd(tokens)                                                 # [batch, pos, vocab], last stream
    _, cache = hd.run_with_cache(tokens)
    cache["blocks.2.hook_resid_post"][:, stream_position(-1, 2, 4)]      # final token, stream 2

Training: `fbt-probe train --arch hidden-decoding --streams 4 [--init CHECKPOINT]`; probing:
`fbt_probe.activations.extract` (or `extract_streams`) writes an activation folder for `fbt_probe.probes.probe_sweep`, whose depth
column then runs over (stream, layer) (`stream_depth`, `split_stream_depth`); figure `hidden`.
"""

from fbt_probe.hidden.checkpoint import is_hidden_checkpoint, load_hidden, save_checkpoint
from fbt_probe.hidden.config import ARCH, HiddenConfig
from fbt_probe.hidden.loss import hidden_loss
from fbt_probe.hidden.model import HiddenDecodingTransformer, StreamAttention, StreamBlock, attended_pairs
from fbt_probe.hidden.streams import (
    split_stream_depth,
    split_streams,
    stream_depth,
    stream_index,
    stream_mask,
    stream_position,
    stream_slice,
    token_index,
)

__all__ = [
    "ARCH",
    "HiddenConfig",
    "HiddenDecodingTransformer",
    "StreamAttention",
    "StreamBlock",
    "attended_pairs",
    "hidden_loss",
    "is_hidden_checkpoint",
    "load_hidden",
    "save_checkpoint",
    "split_stream_depth",
    "split_streams",
    "stream_depth",
    "stream_index",
    "stream_mask",
    "stream_position",
    "stream_slice",
    "token_index",
]
