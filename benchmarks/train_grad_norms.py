"""Gradient norm of one training step at initialisation, K = 1 vs K = 2 passes, and K = 2 with the
carried state detached: why QK-norm gain 3 makes multi-pass steps spiky
(docs/research/qk-norm-gain-and-lr.md, "The cost of gain 3 in multi-pass training") and what the
fusion norm at 1 changes (docs/research/completion-dependable.md, "What each change does").

    python benchmarks/train_grad_norms.py 3.0          # QK-norm gain (1.0 = Qwen3's); the tiny preset's fusion norm
    python benchmarks/train_grad_norms.py 3.0 emb      # fusion norm at the embedding RMS (fusion_norm_init null)

Prints the gradient norm per parameter group and in total (the step's micro-batches summed
without their loss shares: compare the rows with each other, not with metrics.jsonl)."""
import sys

import torch

import fbt_probe as fp
from fbt_probe.tasks.tokenizer import build_tokenizer
from fbt_probe.training import TrainConfig, multipass_loss
from fbt_probe.training.data import batches_for_step
from fbt_probe.training.loop import prefix_mask


def norms(model) -> dict:
    groups = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            key = n.split(".")[0] if not n.startswith("blocks") else "blocks." + n.split(".")[2]
            groups[key] = groups.get(key, 0.0) + p.grad.norm().item() ** 2
    out = {k: round(v ** 0.5, 2) for k, v in groups.items()}
    out["total"] = round(sum(groups.values()) ** 0.5, 2)
    out["backbone (all but fusion)"] = round(sum(v for k, v in groups.items() if k != "fusion") ** 0.5, 2)
    return out


def main(gain: float, fusion_norm_init: float | None) -> None:
    tok = build_tokenizer()
    model = fp.load_model("tiny", seed=0, d_vocab=tok.get_vocab_size(), qk_norm_init=gain,
                          fusion_norm_init=fusion_norm_init).train()
    micro = batches_for_step(TrainConfig(), tok, 3)
    for label, K, detach in (("K=1", 1, False), ("K=2", 2, False), ("K=2, state detached", 2, True)):
        gen = torch.Generator().manual_seed(0)
        shift = model.shift_states
        if detach:
            model.shift_states = lambda s, *a, **k: shift(s.detach(), *a, **k)
        model.zero_grad()
        for t, tg, w in micro:
            loss, _ = multipass_loss(model, t, tg, w, K, 1.0, prefix_mask(*t.shape, 0.25, gen))
            loss.backward()
        model.shift_states = shift
        print(f"gain {gain}, fusion norm {fusion_norm_init or 'embedding RMS'}, {label}: {norms(model)}")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0, None if sys.argv[2:3] == ["emb"] else 1.0)
