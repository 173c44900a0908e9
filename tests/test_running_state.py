"""The running state of a one-token-a-step compose task (`fbt_probe.probes.running`): the points after
each step against the generator's own words composed by `compose_steps`, the step positions against
the tokens they name, the activations against a one-row run with cache in float64, and the probe
table against planted activations that hold the point (accuracy 1) or nothing (chance)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.hooks import depth_name
from fbt_probe.probes.running import running_activations, running_probes, running_state, step_positions
from fbt_probe.tasks import build_tokenizer, generate, load_spec
from fbt_probe.tasks.checker import compose_points
from fbt_probe.tasks.spec import compose_steps
from fbt_probe.training import TrainConfig, run_training
from tests.helpers import make_model
from tests.test_bad_input import one_line_error

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # short cells hold fewer words than asked


def chain(task: str = "chain-s3", groups: int = 12):
    spec, tok = load_spec(task), build_tokenizer()
    return spec, tok, generate(spec.replace(length_grid=[4, 8]), groups=groups, seed=3, tokenizer=tok)


@pytest.mark.parametrize("task", ["chain-s3", "chain-a5"])
def test_the_points_are_the_words_prefixes_composed_and_the_last_gives_the_label(task):
    spec, tok, df = chain(task)
    for text, gid, label in zip(df["text"], df["group_id"], df["label"]):
        word = [int(c, 16) for c in gid.rsplit(":", 1)[1]]  # the generator's word, from the group id
        points = compose_points(spec, text)
        assert len(points) == len(word) + 1
        for j in range(1, len(word) + 1):
            assert points[j] == compose_steps(*(spec.permutations[g] for g in word[:j]))[points[0]]
        assert int(points[-1] in spec.accept) == label


def test_each_step_position_holds_its_word_and_other_designs_are_refused():
    spec, tok, df = chain()
    for text, ids in zip(df["text"], df["token_ids"]):
        pos = step_positions(spec, tok, text, ids)
        assert [tok.id_to_token(ids[p]) for p in pos] == text.split("\n")[1].split(" ")
        assert pos == list(range(pos[0], pos[0] + len(pos)))
    lines = load_spec("compose-s3")
    with pytest.raises(FbtError, match="one word a step"):
        step_positions(lines, tok, df["text"].iloc[0], df["token_ids"].iloc[0])
    with pytest.raises(FbtError, match="does not tokenize as a prefix"):
        step_positions(spec, tok, df["text"].iloc[0], df["token_ids"].iloc[1][::-1])


@pytest.mark.parametrize("mode", ["standard", "full"])
def test_the_activations_are_each_rows_own_run_with_cache(mode):
    spec, tok, df = chain(groups=6)
    model = make_model().double()
    depths = [0, 1, model.cfg.n_layers]
    got = running_activations(model, df, spec, tok, mode, depths, batch_size=5)
    assert sorted(got) == [4, 8]
    for knob, (acts, points, groups) in got.items():
        cell = df[df["length_knob"] == knob].reset_index(drop=True)
        assert acts.shape[:3] == (len(depths), len(cell), knob) and points.shape == (len(cell), knob + 1)
        for n in (0, len(cell) - 1):
            ids = torch.tensor([cell["token_ids"].iloc[n]])
            _, cache = model.run_with_cache(ids, mode=mode)
            pos = step_positions(spec, tok, cell["text"].iloc[n], cell["token_ids"].iloc[n])
            for i, d in enumerate(depths):
                want = cache[depth_name(d)][0, pos].numpy()
                np.testing.assert_allclose(acts[i, n], want, rtol=0, atol=1e-10)


def planted(k: int = 4, n_groups: int = 24, d: int = 6, seed: int = 0):
    """Two samples a group (a pair: two starts, one word); depth 0 holds p_j one-hot, depth 1 noise."""
    rng = np.random.default_rng(seed)
    groups = np.repeat([f"w{g}" for g in range(n_groups)], 2)
    points = rng.integers(0, 3, size=(2 * n_groups, k + 1))
    noise = rng.normal(size=(2, 2 * n_groups, k, d))
    held = noise[0].copy()
    held[..., :3] += 10.0 * np.eye(3)[points[:, 1:]]
    return np.stack([held, noise[1]]), points, groups


def test_the_probe_reads_a_planted_point_and_nothing_from_noise():
    acts, points, groups = planted()
    t = running_probes(acts, points, groups, depths=[0, 7], n_folds=4)
    assert sorted(set(t["step"])) == [1, 2, 3, 4] and set(t["depth"]) == {0, 7}
    held, noise = t[t["depth"] == 0], t[t["depth"] == 7]
    assert (held["accuracy"] == 1.0).all() and (held["ci_low"] > held["chance"]).all()
    assert (noise["ci_low"] <= noise["chance"]).all() and (noise["accuracy"] < 0.8).all()
    assert (t["n_groups"] == 24).all() and (t["n_samples"] == 48).all()
    for j in range(1, 5):  # chance: the commonest point's share at the step
        assert np.isclose(t.loc[t["step"] == j, "chance"].iloc[0], np.bincount(points[:, j]).max() / 48)


def test_the_table_has_a_row_per_mode_knob_step_and_depth():
    spec, tok, df = chain(groups=6)
    t = running_state(make_model(), df, spec, tok, modes=("standard", "recurrent:1"), depths=[0, 2], n_folds=2)
    assert set(t["mode"]) == {"standard", "recurrent:1"} and set(t["depth"]) == {0, 2}
    for knob in (4, 8):
        steps = set(t.loc[t["length_knob"] == knob, "step"])
        assert steps <= set(range(1, knob + 1)) and len(steps) >= knob - 1  # a step with one point is skipped
    assert t["accuracy"].between(0, 1).all() and (t["ci_low"] <= t["accuracy"]).all()


# ----------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def chain_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("chain") / "run"
    run_training(TrainConfig(tasks=("chain-s3",), steps=2), out, progress=False, eval_pairs=2)
    return out


def test_the_command_writes_the_table_with_its_provenance_and_refuses_in_one_line(chain_run, tmp_path):
    runner = CliRunner()
    few = ["--pairs", "6", "--lengths", "4", "--depths", "0,1", "--folds", "2", "--modes", "standard,full"]
    out = tmp_path / "out"
    res = runner.invoke(app, ["diagnose", "running", str(chain_run), *few, "--out", str(out)])
    assert res.exit_code == 0, res.output
    t = pd.read_parquet(out / "running.parquet")
    assert set(t["task"]) == {"chain-s3"} and set(t["mode"]) == {"standard", "full"} and set(t["depth"]) == {0, 1}
    assert set(t["length_knob"]) == {4} and set(t["step"]) <= {1, 2, 3, 4} and t["n_groups"].min() >= 2
    lens = pd.read_parquet(out / "running_lens.parquet")
    assert len(lens) == 2 * 4 * 2  # every mode x step x depth (the lens skips no step)
    assert set(lens["depth"]) == {0, 1} and lens["choice"].between(0, 1).all()
    rec = json.loads((out / "running.json").read_text())
    assert (
        rec["checkpoint_sha256"]
        and rec["modes"] == ["standard", "full"]
        and rec["train_config"]["tasks"] == ["chain-s3"]
    )
    again = runner.invoke(app, ["diagnose", "running", str(chain_run), *few, "--out", str(out)])
    one_line_error(again, "running.parquet")  # an earlier table is replaced only with --force
    assert (
        runner.invoke(app, ["diagnose", "running", str(chain_run), *few, "--out", str(out), "--force"]).exit_code == 0
    )
    for args, says in [
        (["ref:tiny-feedback", "--out", str(tmp_path / "x")], "no compose task with one word a step"),
        ([str(chain_run), "--depths", "0,9", "--out", str(tmp_path / "x")], "expected depths 0..4"),
        ([str(chain_run), "--lengths", "0", "--out", str(tmp_path / "x")], "--lengths 0: expected distinct"),
        ([str(chain_run), "--modes", "sideways", "--out", str(tmp_path / "x")], "sideways"),
        ([str(chain_run), "--pairs", "2", "--out", str(tmp_path / "x")], "--pairs 2: expected an integer 4.."),
    ]:
        res = runner.invoke(app, ["diagnose", "running", *args])
        assert res.exit_code != 0 and says in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("mode", ["standard", "full"])
def test_the_lens_at_the_top_depth_is_the_models_own_logits_at_each_step(mode):
    """At depth L the logit lens is the model's output at that position: its label-word logit
    difference, and its sign against the answer after each step (the points composed in numpy)."""
    from fbt_probe.interventions.pairs import label_token_ids
    from fbt_probe.lens.running import running_lens

    spec, tok, df = chain(groups=6)
    model = make_model()
    L = model.cfg.n_layers
    t = running_lens(model, df, spec, tok, modes=(mode,), depths=[0, L])
    lo, hi = label_token_ids(df, tok)["chain-s3"]
    for knob, cell in df.groupby("length_knob"):
        with torch.no_grad():
            logits = model(torch.tensor(np.stack(cell["token_ids"].to_numpy())), mode=mode)
        pos = [step_positions(spec, tok, a, b) for a, b in zip(cell["text"], cell["token_ids"])]
        ld = np.array([[float(logits[n, p, hi] - logits[n, p, lo]) for p in ps] for n, ps in enumerate(pos)])
        y = np.array([[p == 0 for p in compose_points(spec, text)[1:]] for text in cell["text"]])
        top = t[(t["length_knob"] == knob) & (t["depth"] == L)].sort_values("step")
        np.testing.assert_allclose(top["mean_logit_diff"], ld.mean(0), rtol=0, atol=1e-9)
        np.testing.assert_allclose(top["choice"], ((ld > 0) == y).mean(0), rtol=0, atol=1e-12)
        assert (top["n_groups"] == cell["group_id"].nunique()).all()
