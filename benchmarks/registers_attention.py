"""Attention at the final ':' of register documents (docs/research/register-binding.md,
"Dense supervision and a curriculum: R10–R21").
For every layer and head, the mean attention mass on the value token of the queried register's
latest write vs all other value tokens ("val right/others"), on that write's whole line vs the mean
other write line ("line"), and on the query's register digit ("q").

    python benchmarks/registers_attention.py STATE.pt M            # held-out registers-count, knob M
    python benchmarks/registers_attention.py STATE.pt M W S [Q,..] # M registers x W writes, S scratch lines
                                                                   # (queries drawn from the listed registers)
"""
import sys

import numpy as np
import torch

torch.set_num_threads(1)
from fbt_probe.loading import load_model  # noqa: E402
from fbt_probe.tasks import build_tokenizer  # noqa: E402
from fbt_probe.training.config import TrainConfig  # noqa: E402
from fbt_probe.training.evaluate import eval_samples  # noqa: E402

tok = build_tokenizer()
V = tok.get_vocab()
model = load_model("tiny", seed=0, d_vocab=tok.get_vocab_size())
model.load_state_dict(torch.load(sys.argv[1]))
model.eval()
m = int(sys.argv[2]) if len(sys.argv) > 2 else 2
if len(sys.argv) > 3:  # short format: m registers, W writes each, S scratch lines, one query
    import pandas as pd
    W, S = int(sys.argv[3]), int(sys.argv[4])
    g = np.random.default_rng(7)
    D = [V[str(d)] for d in range(10)]
    docs = []
    for _ in range(128):
        order = g.permutation(np.repeat(np.arange(m), W)).tolist()
        writes = [(r, int(g.integers(0, 2))) for r in order]
        ids = []
        for r, v in writes:
            ids += [V["r"], D[r], V["="], D[v], V["\n"]]
        if S:
            ids += [V["scratch"], V["="], D[3], V["\n"]] + [V["scratch"], V["+="], D[0], V["\n"]] * (S - 1)
        q = int(g.integers(0, m)) if len(sys.argv) < 6 else int(g.choice([int(x) for x in sys.argv[5].split(",")]))
        ids += [V["query"], V["="], V["r"], D[q], V["\n"], V["Value"], V[":"]]
        docs.append({"token_ids": ids, "label_word": ["zero", "one"][dict(writes)[q]]})
    s = pd.DataFrame(docs)
else:
    cfg = TrainConfig(tasks=("registers-count",), baseline=True)
    s = eval_samples(cfg, tok, pairs=32)
    s = s[s.length_knob == m]
toks = torch.tensor(s["token_ids"].tolist())
names = [n for n in model.hook_dict if n.endswith("attn.hook_pattern")]
_, cache = model.run_with_cache(toks, mode="standard", names_filter=lambda n: n.endswith("hook_pattern"))
logits = model(toks, mode="standard")[:, -1]
pred = logits.argmax(-1).numpy()
ans = s["label_word"].map(V.get).to_numpy()
print(f"m={m} accuracy {np.mean(pred == ans):.3f} on {len(s)}")
R, EQ, NL = V["r"], V["="], V["\n"]
rows = []
for b, ids in enumerate(s["token_ids"]):
    ids = list(ids)
    q = ids[-4]  # query = r {q} \n Value :
    last, vals = None, []
    for t in range(2, len(ids) - 7):
        if ids[t - 1] == EQ and ids[t - 3] == R:  # value token of a write r d = v
            vals.append((t, ids[t - 2]))
    latest = max(t for t, d in vals if d == q)
    rows.append((b, latest, [t for t, _ in vals if t != latest], len(ids) - 4))
for n in names:
    pat = cache[n][:, :, -1, :]  # [batch, heads, key]
    out = []
    for h in range(pat.shape[1]):
        a_ = np.mean([pat[b, h, lt].item() for b, lt, _, _ in rows])
        o_ = np.mean([pat[b, h, ot].sum().item() for b, _, ot, _ in rows])
        q_ = np.mean([pat[b, h, qt].item() for b, _, _, qt in rows])
        l_ = np.mean([pat[b, h, lt - 3: lt + 2].sum().item() for b, lt, _, _ in rows])
        ol = np.mean([sum(pat[b, h, t - 3: t + 2].sum().item() for t in ot) / max(1, len(ot)) for b, _, ot, _ in rows])
        out.append(f"h{h}: val {a_:.2f}/{o_:.2f} line {l_:.2f}/{ol:.2f}(per other line) q {q_:.2f}")
    print(n.split(".hook")[0], " | ".join(out))
