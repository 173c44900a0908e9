"""nnsight on the latent-feedback model, several invokes in one trace.

`nnsight.NNsight(model)` traces one input: the base envoy cannot batch invokes. `traceable(model)`
returns an `NNsight` whose invokes are batched along dim 0, so nnsight's clean -> corrupted pattern
runs in one trace:

    nn_model = traceable(model)
    with nn_model.trace(mode="recurrent:1") as tracer:
        with tracer.invoke(clean):
            resid = nn_model.blocks[1].hook_resid_post.output[:, 6].save()
        with tracer.invoke(corrupt):
            nn_model.blocks[1].hook_resid_post.output[:, 6] = resid
            patched = nn_model.output.save()

Each invoke's reads and writes are its own rows, and the rows of a batch are independent (every
mode computes each row's carried states from that row alone), so the result equals separate runs.
The mode (and `serial`) is the trace's, one per trace: an invoke that asks for another is refused,
as are invokes of different lengths (a padded batch cannot run with nnsight's wrappers on the
modules). nnsight instruments modules, so a trace runs the one-pass rule unless `serial=True`
(docs/modes.md). nnsight is an optional dependency (the dev extra); it is imported on first use.
"""

from __future__ import annotations

import torch

from fbt_probe.errors import FbtError

RUN_KEYS = ("mode", "serial")


def traceable(model):
    """An `nnsight.NNsight` of `model` whose invokes batch (see module doc)."""
    try:
        from nnsight import NNsight
    except ImportError:
        raise FbtError("traceable: nnsight is not installed (pip install nnsight)") from None

    class FeedbackNNsight(NNsight):
        def _batch_size(self, *inputs, **kwargs) -> int:
            return _rows(inputs[0]) if inputs else 0

        def _batch(self, invokes: list, fn=None) -> tuple:
            return batch_invokes(self._module, invokes)

    return FeedbackNNsight(model)


def _rows(x) -> int:
    if isinstance(x, str):
        return 1
    if isinstance(x, list):
        return len(x)
    return int(torch.as_tensor(x).shape[0]) if torch.as_tensor(x).dim() > 1 else 1


def batch_invokes(model, invokes: list) -> tuple:
    """((tokens,), kwargs) of several invokes: their token rows concatenated, their run keywords
    (`mode`, `serial`) the same, or one line saying which differ."""
    if not invokes:
        return tuple(), {}
    if len(invokes) == 1:
        return invokes[0]
    rows, kwargs = [], {}
    for i, (inputs, kw) in enumerate(invokes):
        if not inputs:
            raise FbtError(f"nnsight invoke {i}: expected token ids or text as its input")
        x = inputs[0]
        x = model.to_tokens(x) if isinstance(x, (str, list)) else torch.as_tensor(x)
        rows.append(x if x.dim() == 2 else x[None])
        for key in RUN_KEYS:
            if key in kw and key in kwargs and kw[key] != kwargs[key]:
                raise FbtError(
                    f"nnsight invoke {i}: {key}={kw[key]!r} but an earlier invoke has {kwargs[key]!r}; one trace "
                    f"runs one {key}: pass it to trace(...) or run one trace per {key}"
                )
        kwargs.update(kw)
    lengths = sorted({r.shape[1] for r in rows})
    if len(lengths) > 1:
        raise FbtError(
            f"nnsight invokes of {lengths} tokens: one trace batches rows of one length (a padded batch "
            "cannot run with nnsight's wrappers on the modules); run one trace per length"
        )
    return (torch.cat(rows, dim=0),), kwargs
