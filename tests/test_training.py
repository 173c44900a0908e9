"""Multi-pass training: the objective of eq. 12, gradients, noise, resume, checkpoints, CLI errors."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import fbt_probe as fp
from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.training import TrainConfig, multipass_loss, parse_schedule, run_training
from fbt_probe.training.data import batches_for_step, one_per_row
from tests.helpers import make_model, tokens

runner = CliRunner()
SMALL = dict(
    tokens_per_step=400,
    warmup=2,
    eval_every=10_000,
    save_every=2,
    tasks=("completion", "memory", "registers"),
    knobs={"completion": [0, 8], "memory": [8], "registers": [2]},
)


def _batch(T=14, seed=3):
    toks = tokens(2, T, seed=seed)
    targets = tokens(2, T, seed=seed + 1)
    weights = torch.rand(2, T, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return toks, targets, weights


def _reference_ce(logits, targets, weights):
    logp = torch.log_softmax(logits.double(), -1)
    nll = -logp.gather(-1, targets[..., None])[..., 0]
    return (nll * weights).sum() / weights.sum()


@pytest.mark.parametrize("K,lam", [(1, 1.0), (2, 1.0), (3, 1.0), (3, 0.5)])
def test_multipass_loss_equals_hand_written_reference(K, lam):
    model = make_model()
    toks, targets, weights = _batch()
    total, parts = multipass_loss(model, toks, targets, weights, K, lam)
    ref_parts = [_reference_ce(model(toks, mode=f"jacobi:{k}"), targets, weights) for k in range(1, K + 1)]
    ref = ref_parts[0] + (lam / (K - 1) * sum(ref_parts[1:]) if K > 1 else 0)
    torch.testing.assert_close(total.double(), ref, rtol=0, atol=1e-12)
    for p, r in zip(parts, ref_parts):
        torch.testing.assert_close(p.double(), r, rtol=0, atol=1e-12)


def test_gradient_reaches_fusion_only_with_two_or_more_passes():
    model = make_model()
    toks, targets, weights = _batch()
    for K in (1, 2):
        model.zero_grad(set_to_none=True)
        multipass_loss(model, toks, targets, weights, K)[0].backward()
        g = model.fusion.W_U.weight.grad, model.fusion.W_G.weight.grad
        if K == 1:
            assert g[0] is None and g[1] is None
        else:
            assert g[0].abs().sum() > 0 and g[1].abs().sum() > 0
    # not detached: pass 2's loss sends gradient through pass 1's states into the backbone
    model.zero_grad(set_to_none=True)
    parts = multipass_loss(model, toks, targets, weights, 2)[1]
    parts[1].backward()
    assert model.blocks[0].mlp.down_proj.weight.grad.abs().sum() > 0


def test_noise_only_in_training_mode():
    model = make_model()
    toks, targets, weights = _batch()
    eval_a = multipass_loss(model, toks, targets, weights, 2)[0]
    eval_b = multipass_loss(model, toks, targets, weights, 2)[0]
    assert torch.equal(eval_a, eval_b)
    model.train()
    train_a = multipass_loss(model, toks, targets, weights, 2)[0]
    one_pass = [multipass_loss(model, toks, targets, weights, 1)[0] for _ in range(2)]
    model.eval()
    assert not torch.equal(train_a, eval_a)
    assert torch.equal(one_pass[0], one_pass[1])  # no carried state, no noise


def test_one_document_per_row_weights_the_answer():
    docs = [{"token_ids": [5, 6, 3, 9, 2], "answer_pos": 3}, {"token_ids": [8, 3, 4, 2], "answer_pos": 2}]
    toks, targets, weights = one_per_row(docs, answer_weight=5.0)
    assert toks.tolist() == [[5, 6, 3, 9, 2], [8, 3, 4, 2, 0]]
    # position 2 predicts the answer (index 3); each row's weights sum to 1 (documents count equally)
    torch.testing.assert_close(weights[0], torch.tensor([1, 1, 5, 1, 0]) / 8.0)
    torch.testing.assert_close(weights[1], torch.tensor([1, 5, 1, 0, 0]) / 7.0)
    assert targets[0, 2] == 9


def test_a_step_mixes_cells_in_unpadded_micro_batches():
    from fbt_probe.tasks import build_tokenizer

    cfg = TrainConfig(**{**SMALL, "tokens_per_step": 600})
    tok = build_tokenizer()
    for step in range(4):
        micro = batches_for_step(cfg, tok, step)
        n_tokens = sum(t.numel() for t, _, _ in micro)
        assert (
            len(micro) >= 2 and 600 <= n_tokens < 600 + 121
        )  # the budget, overshot by at most one (registers, 121-token) document
        for toks, _, weights in micro:
            assert (toks != 0).all() and (weights == weights.max(1, keepdim=True).values).sum(1).eq(
                1
            ).all()  # no padding, one answer per row


@pytest.mark.parametrize(
    "text,ok",
    [
        ("paper", True),
        ("constant:3", True),
        ("1:.5,2:.5", True),
        ("1:.5,2:.4", False),
        ("constant:0", False),
        ("1:a", False),
        ("1:.5,1:.5", False),
        ("full", True),
        ("full:2", False),
    ],
)
def test_schedule_parsing(text, ok):
    if ok:
        s = parse_schedule(text)
        assert s.draw(0.0) == s.probs[0][0] and s.draw(0.999) == s.probs[-1][0]
    else:
        with pytest.raises(FbtError, match="schedule"):
            parse_schedule(text)


def test_the_full_schedule_names_itself_and_trains_every_depth():
    """'full' round-trips through the recorded string, its curriculum and diagnostics read `full`,
    and no trained depth is marked on a contraction figure for it (it trains every depth)."""
    import pandas as pd

    from fbt_probe.reproduce.parts.contraction import trained_passes

    full, paper = parse_schedule("full"), parse_schedule("paper")
    assert str(full) == "full" and str(parse_schedule(str(full))) == "full" and full.serial and not paper.serial
    assert (full.deepest_mode, paper.deepest_mode, parse_schedule("constant:1").deepest_mode) == (
        "full",
        "jacobi:3",
        "standard",
    )
    assert full.max_passes == 2 and full.draw(0.3) == "full"
    t = pd.DataFrame(
        {"run": ["a", "b", "c"], "schedule": ["full", "1:0.75,2:0.25", "constant:1 (baseline)"], "pass": 1}
    )
    assert trained_passes(t) == {"b": 2, "c": 1}


def test_resume_is_bit_for_bit(tmp_path):
    cfg = TrainConfig(steps=4, **SMALL)
    run_training(cfg, tmp_path / "straight", progress=False, eval_pairs=2)
    run_training(TrainConfig(steps=2, **SMALL), tmp_path / "split", progress=False, eval_pairs=2)
    run_training(cfg, tmp_path / "split", resume=True, progress=False, eval_pairs=2)
    a, b = fp.load_model(str(tmp_path / "straight")), fp.load_model(str(tmp_path / "split"))
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name  # the same steps on the same shapes: bit for bit
    assert (tmp_path / "straight" / "model.safetensors").read_bytes() == (
        tmp_path / "split" / "model.safetensors"
    ).read_bytes()
    run_training(cfg, tmp_path / "again", progress=False, eval_pairs=2)
    for name in ("train_state.pt", "model.safetensors"):  # before: train_state.pt's zip named a random temp file
        assert (tmp_path / "straight" / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name
    log = [json.loads(l) for l in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]


def test_resuming_a_finished_run_trains_nothing_and_says_so(tmp_path, capsys):
    """A finished run folder resumed (what a study's train stage does with a run trained beside it)
    keeps its checkpoint byte for byte and says there is nothing to train, with no empty progress bar."""
    cfg = TrainConfig(steps=2, **SMALL)
    run_training(cfg, tmp_path / "r", progress=False, eval_pairs=2)
    before = (tmp_path / "r" / "model.safetensors").read_bytes()
    capsys.readouterr()
    run_training(cfg, tmp_path / "r", resume=True, progress=True, eval_pairs=2)
    said = capsys.readouterr()
    assert "already at step 2 of 2" in said.out and "nothing to train" in said.out
    assert "loss nan" not in said.out + said.err
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == before


def test_checkpoint_round_trip_is_exact(tmp_path):
    from fbt_probe.formats.checkpoint import save_checkpoint

    model = fp.load_model("tiny", seed=4)
    save_checkpoint(model, tmp_path)
    again = fp.load_model(str(tmp_path))
    assert again.cfg == model.cfg
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), again.state_dict().values()))


@pytest.mark.slow
def test_smoke_training_lowers_the_loss(tmp_path):
    run_training(
        TrainConfig(steps=40, **{**SMALL, "tokens_per_step": 800, "warmup": 5}),
        tmp_path / "r",
        progress=False,
        eval_pairs=2,
    )
    log = [json.loads(l) for l in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    first = sum(r["pass_losses"][0] for r in log[:5]) / 5
    last = sum(r["pass_losses"][0] for r in log[-5:]) / 5
    assert last < 0.6 * first


def test_baseline_never_uses_more_than_one_pass(tmp_path):
    run_training(TrainConfig(steps=3, baseline=True, **SMALL), tmp_path / "b", progress=False, eval_pairs=2)
    log = [json.loads(l) for l in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert {r["passes"] for r in log} == {1}
    meta = json.loads((tmp_path / "b" / "config.json").read_text())
    assert meta["train"]["schedule"] == "constant:1" and meta["train"]["baseline"] is True


def test_cli_errors(tmp_path):
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "x").write_text("keep me")
    cases = [
        (["train", "--out", str(tmp_path / "a"), "--preset", "huge"], "unknown preset"),
        (["train", "--out", str(tmp_path / "a"), "--schedule", "1:.5,2:.3"], "sum to 0.8"),
        (["train", "--out", str(tmp_path / "exists")], "refusing to overwrite"),
        (["train", "--out", str(tmp_path / "a"), "--resume"], "no run to resume"),
        (["eval", str(tmp_path / "exists")], "run config not found"),
        (
            ["train", "--out", str(tmp_path / "a"), "--task-shares", "completion:.5,memory:x"],
            "expected 'task:share,...'",
        ),
        (
            ["train", "--out", str(tmp_path / "a"), "--task-shares", "completion:.5,memory:.5"],
            "a positive share for each of",
        ),
    ]
    for args, message in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert message in res.output and res.output.strip().count("\n") == 0
    assert (tmp_path / "exists" / "x").read_text() == "keep me" and not (tmp_path / "a").exists()


def test_warm_start_refuses_a_mismatched_checkpoint(tmp_path):
    from fbt_probe.formats.checkpoint import save_checkpoint

    save_checkpoint(fp.load_model("tiny"), tmp_path / "wrong-vocab")  # 128 tokens vs the task tokenizer's 37
    with pytest.raises(FbtError, match="vocabulary"):
        run_training(TrainConfig(steps=1, **SMALL), tmp_path / "r", init=tmp_path / "wrong-vocab", progress=False)


def test_contraction_table_matches_the_jacobi_modes():
    from fbt_probe.tasks import build_tokenizer
    from fbt_probe.training.data import validation_batch
    from fbt_probe.training.evaluate import contraction

    tok = build_tokenizer()
    model = fp.load_model("tiny", d_vocab=tok.get_vocab_size(), seed=2).eval()
    toks, targets, weights = validation_batch(TrainConfig(**SMALL), tok, rows=4)
    table = contraction(model, toks, targets, weights, n_passes=3)
    real = (weights > 0).float()
    with torch.no_grad():
        for k in (1, 2, 3):
            ref = F.cross_entropy(model(toks, mode=f"jacobi:{k}").transpose(1, 2), targets, reduction="none")
            expected = float((ref * real).sum() / real.sum())
            assert abs(table.loc[k - 1, "val_loss"] - expected) < 1e-4
    assert table["answer_accuracy"].notna().all() and table["state_change"].iloc[1:].gt(0).all()


def test_diagnose_contraction_compares_several_runs(tmp_path):
    """Two runs (two schedules) in one table and figure, measured on the same validation rows: each
    run's rows equal the single-run command's."""
    import pandas as pd

    run_training(TrainConfig(steps=2, **SMALL), tmp_path / "paper", progress=False, eval_pairs=2)
    run_training(TrainConfig(steps=2, schedule="1:.75,2:.25", **SMALL), tmp_path / "two", progress=False, eval_pairs=2)
    res = runner.invoke(
        app, ["diagnose", "contraction", str(tmp_path / "paper"), str(tmp_path / "two"), "--passes", "4", "--rows", "4"]
    )
    assert res.exit_code == 2 and "need --out" in res.output
    res = runner.invoke(
        app,
        [
            "diagnose",
            "contraction",
            str(tmp_path / "paper"),
            str(tmp_path / "two"),
            "--passes",
            "4",
            "--rows",
            "4",
            "--out",
            str(tmp_path / "cmp"),
        ],
    )
    assert res.exit_code == 0, res.output
    both = pd.read_parquet(tmp_path / "cmp" / "contraction.parquet")
    assert list(both.groupby("run", sort=False)["schedule"].first()) == ["1:0.75,2:0.22,3:0.03", "1:0.75,2:0.25"]
    assert (tmp_path / "cmp" / "contraction.png").is_file()
    res = runner.invoke(app, ["diagnose", "contraction", str(tmp_path / "two"), "--passes", "4", "--rows", "4"])
    assert res.exit_code == 0, res.output
    single = pd.read_parquet(tmp_path / "two" / "diagnostics" / "contraction.parquet")
    pd.testing.assert_frame_equal(both[both["run"] == "two"].reset_index(drop=True), single)
    meta = json.loads((tmp_path / "cmp" / "contraction.json").read_text())
    assert len(meta["checkpoint_sha256"]) == 2


def test_qk_norm_gains_start_at_the_configured_value():
    """The tiny preset starts the QK-norm gains at 3 (see ModelConfig.qk_norm_init); Qwen3's default is 1."""
    tiny = fp.load_model("tiny", seed=0)
    assert all(
        torch.equal(b.attn.q_norm.weight, torch.full_like(b.attn.q_norm.weight, 3.0))
        and torch.equal(b.attn.k_norm.weight, torch.full_like(b.attn.k_norm.weight, 3.0))
        for b in tiny.blocks
    )
    plain = fp.load_model("tiny", seed=0, qk_norm_init=1.0)
    assert all(torch.equal(b.attn.q_norm.weight, torch.ones_like(b.attn.q_norm.weight)) for b in plain.blocks)
    # the gains are the only difference: every other parameter is drawn identically
    for (name, x), y in zip(tiny.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(x, y) or name.endswith(("q_norm.weight", "k_norm.weight")), name


def test_one_pass_steps_follow_the_baseline_exactly(tmp_path):
    """With one_pass_steps = N the feedback model's first N steps are the baseline's, bit for bit
    (same data, same draws; the fusion gets no gradient and stays at its initial values); after N,
    K follows the schedule."""
    run_training(TrainConfig(steps=3, baseline=True, **SMALL), tmp_path / "base", progress=False, eval_pairs=2)
    run_training(TrainConfig(steps=3, one_pass_steps=3, **SMALL), tmp_path / "fb", progress=False, eval_pairs=2)
    base, fb = fp.load_model(str(tmp_path / "base")), fp.load_model(str(tmp_path / "fb"))
    init = fp.load_model("tiny", seed=0, d_vocab=base.cfg.d_vocab)
    for (name, x), y, z in zip(fb.state_dict().items(), base.state_dict().values(), init.state_dict().values()):
        assert torch.equal(x, z if name.startswith("fusion.") else y), name
    run_training(
        TrainConfig(steps=12, one_pass_steps=6, schedule="constant:2", **SMALL),
        tmp_path / "later",
        progress=False,
        eval_pairs=2,
    )
    log = [json.loads(l) for l in (tmp_path / "later" / "metrics.jsonl").read_text().splitlines()]
    assert [r["passes"] for r in log] == [1] * 6 + [2] * 6


def test_fusion_norm_starts_at_the_configured_value():
    """fusion_norm_init = None starts the fusion norm at the mean RMS of the embedding rows (fused
    inputs at embedding scale); a number starts every entry at it. Nothing else changes."""
    by_rms = fp.load_model("tiny", seed=0, fusion_norm_init=None)
    rms = by_rms.embed.weight.double().pow(2).mean(-1).sqrt().mean()
    assert torch.allclose(by_rms.fusion.norm.weight.double(), rms.expand(by_rms.cfg.d_model), rtol=1e-6)
    ones = fp.load_model("tiny", seed=0, fusion_norm_init=1.0)
    assert torch.equal(ones.fusion.norm.weight, torch.ones(ones.cfg.d_model))
    for (name, x), y in zip(by_rms.state_dict().items(), ones.state_dict().values()):
        assert torch.equal(x, y) or name == "fusion.norm.weight", name
    # a fused input is RMSNorm'd and scaled by that weight: its RMS is the weight (up to eps)
    e = ones.embed(tokens(2, 9, seed=1))
    u = ones.fusion(torch.randn(2, 9, ones.cfg.d_model), e, torch.ones(9, dtype=torch.bool), lambda hp, x: x)
    assert torch.allclose(u.pow(2).mean(-1).sqrt(), torch.ones(2, 9), atol=1e-4)


def test_task_shares_set_each_tasks_share_of_the_tokens():
    """The draw probability of a cell is ∝ token share / length, so the expected token share of a
    task is its `task_shares` entry (default .5 / .25 / .25); over many steps the drawn tokens follow it."""
    from fbt_probe.tasks import build_tokenizer
    from fbt_probe.training.config import DEFAULT_TASK_SHARES
    from fbt_probe.training.data import cell_probabilities

    tok = build_tokenizer()
    three = ("completion", "memory", "registers")
    shares = {"completion": 0.5, "memory": 0.2, "registers": 0.3}
    two = {"completion": 2 / 3, "memory": 1 / 3}  # the defaults (.5, .25) renormalised over the tasks trained
    four = {t: v / 1.25 for t, v in DEFAULT_TASK_SHARES.items()}  # every task: .4 / .2 / .2 / .2
    for cfg, want in (
        (TrainConfig(), four),
        (TrainConfig(tasks=three, task_shares=shares), shares),
        (TrainConfig(tasks=("completion", "memory")), two),
    ):
        assert cfg.task_shares == pytest.approx(want, abs=1e-12)
        cells, lengths, p = cell_probabilities(cfg, tok)
        expected = p * lengths / (p * lengths).sum()  # expected share of the tokens per cell
        for task in cfg.tasks:
            mine = [i for i, (t, _) in enumerate(cells) if t == task]
            assert expected[mine].sum() == pytest.approx(want[task], abs=1e-12)
            assert np.allclose(expected[mine], want[task] / len(mine), atol=1e-12)
    # a run written before the field existed drew every (task, length) cell with the same share
    old = TrainConfig(
        tasks=three, knobs={"completion": [0, 8, 32], "memory": [8, 32], "registers": [2, 4, 8]}
    ).to_dict()
    del old["task_shares"]
    assert TrainConfig.from_dict(old, legacy=True).task_shares == pytest.approx(
        {"completion": 3 / 8, "memory": 2 / 8, "registers": 3 / 8}
    )
    with pytest.raises(FbtError, match="field 'task_shares' missing"):  # a run of the current format records it
        TrainConfig.from_dict(old)
    cfg = TrainConfig(tasks=three, task_shares=shares, tokens_per_step=4096)
    cells, lengths, _ = cell_probabilities(cfg, tok)
    task_of_length = {int(n): t for (t, _), n in zip(cells, lengths)}
    assert len(task_of_length) == len(cells)  # a micro-batch's length names its cell
    drawn = {t: 0 for t in cfg.tasks}
    for step in range(60):
        for toks, _, _ in batches_for_step(cfg, tok, step):
            drawn[task_of_length[toks.shape[1]]] += toks.numel()
    total = sum(drawn.values())
    for t in cfg.tasks:
        assert drawn[t] / total == pytest.approx(shares[t], abs=0.03)


@pytest.mark.parametrize(
    "shares, what",
    [
        ({"completion": 0.5, "memory": 0.5}, "a positive share for each of"),
        ({"completion": 0.5, "memory": 0.3, "registers": 0.3}, "sums to 1.1"),
        ({"completion": 1.0, "memory": 0.0, "registers": 0.0}, "a positive share"),
    ],
)
def test_bad_task_shares_are_refused(shares, what):
    with pytest.raises(FbtError, match=what):
        TrainConfig(tasks=("completion", "memory", "registers"), task_shares=shares)


def test_answer_weighting_per_document():
    """Every document's weights sum to 1. By default the answer position weighs `answer_weight` text
    tokens; with `answer_share` it takes exactly that share of every document, whatever its length."""
    docs = [{"token_ids": list(range(1, 17)), "answer_pos": 14}, {"token_ids": list(range(1, 145)), "answer_pos": 142}]
    _, targets, w = one_per_row(docs, 20.0)
    assert torch.allclose(w.sum(1), torch.ones(2)) and w[0, 15:].abs().sum() == 0  # padding and last token: 0
    for r, doc in enumerate(docs):
        n = len(doc["token_ids"]) - 1  # weighted positions, the answer's among them
        assert w[r, doc["answer_pos"] - 1].item() == pytest.approx(20 / (n - 1 + 20))
        assert targets[r, doc["answer_pos"] - 1] == doc["token_ids"][doc["answer_pos"]]
    _, _, w = one_per_row(docs, 20.0, answer_share=0.5)
    assert torch.allclose(w.sum(1), torch.ones(2))
    assert [w[r, d["answer_pos"] - 1].item() for r, d in enumerate(docs)] == pytest.approx([0.5, 0.5])
    for bad in (0.0, 1.5):  # 1.0 is allowed: the answers only (tests/test_training_registers.py)
        with pytest.raises(FbtError, match="answer_share"):
            TrainConfig(answer_share=bad)
    # the default is a share of 0.5; a run written before the field existed weighted the answer ×20
    assert TrainConfig().answer_share == 0.5
    old = TrainConfig().to_dict()
    del old["answer_share"]
    assert TrainConfig.from_dict(old, legacy=True).answer_share is None
    with pytest.raises(FbtError, match="field 'answer_share' missing"):
        TrainConfig.from_dict(old)


def test_held_out_accuracy_asks_every_kind_of_pair_a_group_holds():
    """A register group holds one pair per query register, in register order; taking each group's
    first pair (as before) evaluated `query = r0` only. The k-th group of a cell now gives its pair
    k mod m: each register is queried equally often (within one) in every cell, all contexts held
    out. The same rule gives completion both of a group's `required` counts."""
    import re

    from fbt_probe.tasks import build_tokenizer
    from fbt_probe.training.data import heldout
    from fbt_probe.training.evaluate import eval_samples

    tok = build_tokenizer()
    cfg = TrainConfig()
    df = eval_samples(cfg, tok, pairs=16)
    for task, m_of in (("registers", lambda k: 8), ("registers-count", lambda k: k)):
        for knob, cell in df[df["task"] == task].groupby("length_knob"):
            assert len(cell) == 32 and cell["group_id"].nunique() == 16  # 16 pairs, one per group
            asked = cell.groupby("pair_id")["text"].first().map(lambda t: int(re.search(r"query = r(\d)", t).group(1)))
            counts = asked.value_counts().reindex(range(m_of(knob)), fill_value=0)
            assert counts.max() - counts.min() <= 1 and counts.sum() == 16, (task, knob, counts.to_dict())
    held = heldout(cfg)
    assert all(c in held for c in df["context_id"])
    # completion: a group {a, b} holds the pairs required = a and required = b (completed differs);
    # each group's first pair alone had required < completed in every "more" sample
    comp = df[df["task"] == "completion"]["text"].str.extract(r"required = (\d+)\ncompleted = (\d+)").astype(int)
    below, above = int((comp[1] < comp[0]).sum()), int((comp[1] > comp[0]).sum())
    assert below > 0 and above > 0 and abs(below - above) <= 3, (below, above)
    mem = df[df["task"] == "memory"]
    assert (mem.groupby(["length_knob", "group_id"])["pair_id"].nunique() == 1).all()


def test_a_study_stage_resumes_only_a_run_of_its_own_training_config(tmp_path, capsys):
    """The study's train stages adopt a finished run in their folder (a run trained beside the study,
    or one its killed stage left) only when config.json records the stage's own training config; a run
    of another seed is refused in one line naming the field and `--force STAGE`, and left as it was."""
    import dataclasses

    from fbt_probe.errors import FbtError
    from fbt_probe.reproduce.parts.training import train_run as _train

    cfg = TrainConfig(steps=2, **SMALL)
    run_training(cfg, tmp_path / "r", progress=False, eval_pairs=2)
    before = (tmp_path / "r" / "model.safetensors").read_bytes()
    with pytest.raises(FbtError) as err:
        _train(dataclasses.replace(cfg, seed=cfg.seed + 1), tmp_path / "r", "train-feedback")
    msg = str(err.value)
    assert "config.json: field 'train.seed'" in msg and "--force train-feedback" in msg and "\n" not in msg
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == before
    capsys.readouterr()
    _train(cfg, tmp_path / "r", "train-feedback")
    assert "nothing to train" in capsys.readouterr().out
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == before
