"""`fbt-probe reproduce`: stage skipping, errors, and (slow) the quick study end to end."""

import json
import re

import pytest
from typer.testing import CliRunner

import fbt_probe as fp
from fbt_probe.cli import app
from fbt_probe.reproduce.stages import Runner, Stage, time_table

runner = CliRunner()


def test_stage_runner_skips_up_to_date_stages_and_redoes_forced_ones(tmp_path):
    calls = []

    def make(name, value):
        def fn():
            calls.append(name)
            (tmp_path / name).write_text(value)

        return Stage(name, {"value": value}, [tmp_path / name], fn)

    log = []
    r = Runner(tmp_path, echo=log.append)
    r.run(make("a", "1"))
    r.run(Stage("b", {}, [tmp_path / "b"], lambda: (calls.append("b"), (tmp_path / "b").write_text("x")), after=["a"]))
    assert calls == ["a", "b"]
    r2 = Runner(tmp_path, echo=log.append)
    r2.run(make("a", "1"))
    r2.run(Stage("b", {}, [tmp_path / "b"], lambda: calls.append("b2"), after=["a"]))
    assert calls == ["a", "b"]  # both up to date
    r3 = Runner(tmp_path, echo=log.append)
    r3.run(make("a", "2"))  # changed input: a reruns, and b (whose key includes a's) reruns too
    r3.run(
        Stage("b", {}, [tmp_path / "b"], lambda: (calls.append("b3"), (tmp_path / "b").write_text("y")), after=["a"])
    )
    assert calls == ["a", "b", "a", "b3"]
    r4 = Runner(tmp_path, force={"a"}, echo=log.append)
    r4.run(make("a", "2"))
    r4.run(
        Stage("b", {}, [tmp_path / "b"], lambda: (calls.append("b4"), (tmp_path / "b").write_text("z")), after=["a"])
    )
    assert calls[-2:] == ["a", "b4"]  # a forced stage also invalidates what reads it


def test_the_time_table_lists_each_stage_run_or_skipped_and_sums_those_run():
    text = time_table({"data": 0.4, "train": 61.25, "figures": 12.0}, {"data": False, "train": True, "figures": True})
    lines = text.splitlines()
    assert lines[0].split() == ["stage", "seconds"]
    assert [ln.split() for ln in lines[1:4]] == [
        ["data", "skip", "0.4"],
        ["train", "run", "61.2"],
        ["figures", "run", "12.0"],
    ]
    assert lines[4].split() == ["sum", "run", "here", "73.2"]  # the skipped stage's recorded 0.4 s is not counted


def test_a_stale_trained_model_is_kept_unless_forced(tmp_path):
    """A resumable stage (training) whose inputs changed refuses to delete its model; --force redoes it;
    the same inputs resume it (the function runs on the existing folder)."""
    from fbt_probe.errors import FbtError

    model = tmp_path / "models" / "m"

    def train(tag):
        def fn():
            model.mkdir(parents=True, exist_ok=True)
            (model / "log").open("a").write(tag)

        return fn

    Runner(tmp_path, echo=lambda _: None).run(Stage("train-m", {"steps": 10}, [model], train("a"), resumable=True))
    with pytest.raises(FbtError, match="pass --force train-m"):
        Runner(tmp_path, echo=lambda _: None).run(Stage("train-m", {"steps": 20}, [model], train("b"), resumable=True))
    assert (model / "log").read_text() == "a"  # untouched
    Runner(tmp_path, force={"train-m"}, echo=lambda _: None).run(
        Stage("train-m", {"steps": 20}, [model], train("c"), resumable=True)
    )
    assert (model / "log").read_text() == "c"  # forced: deleted, then redone


def test_cli_errors(tmp_path):
    res = runner.invoke(app, ["reproduce", "--preset", "paper-1b", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "--model" in res.output
    res = runner.invoke(app, ["reproduce", "--quick", "--out", str(tmp_path / "r"), "--force", "nonsense"])
    assert res.exit_code == 2 and "unknown stage" in res.output
    res = runner.invoke(
        app, ["reproduce", "--preset", "paper-1b", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 2 and "not found" in res.output
    for pair in (["--quick", "--long"], ["--demo", "--quick"]):
        res = runner.invoke(app, ["reproduce", *pair, "--out", str(tmp_path / "r2")])
        assert res.exit_code == 2 and "choose one" in res.output and not (tmp_path / "r2").exists()
    # a seeds study trains its seeds: on the shipped models (which bring their own seeds table) it is refused
    res = runner.invoke(app, ["reproduce", "--seeds", "3", "--out", str(tmp_path / "r4")])
    assert res.exit_code == 2 and "--seeds: needs --train" in res.output and not (tmp_path / "r4").exists()
    # the default studies the shipped models: a seed or step count they were not trained with is refused
    from fbt_probe.reference import record

    shipped = f"trained with seed 0 and {record('tiny-feedback')['steps']} steps; pass --train"
    for args, match in ((["--seed", "5"], shipped), (["--steps", "10"], shipped)):
        res = runner.invoke(app, ["reproduce", *args, "--out", str(tmp_path / "r3")])
        assert res.exit_code == 2 and res.output.count("\n") == 1 and match in res.output, res.output
        assert not (tmp_path / "r3").exists()
    # --train with fewer steps than the recipe's warm-up: one line, nothing written
    res = runner.invoke(app, ["reproduce", "--train", "--steps", "300", "--out", str(tmp_path / "r5")])
    assert (
        res.exit_code == 2 and res.output.count("\n") == 1 and "induction warm-up alone takes 500 steps" in res.output
    ), res.output
    assert not (tmp_path / "r5").exists()


def test_wilson_interval_is_scipys():
    from scipy.stats import binomtest

    from fbt_probe.stats import wilson

    for k, n in ((0, 10), (3, 10), (10, 10), (187, 200), (1, 1)):
        p, lo, hi = wilson(k, n)
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert p == k / n and abs(lo - ci.low) < 2e-4 and abs(hi - ci.high) < 2e-4  # z = 1.96 vs the exact quantile


def test_long_config_adds_the_long_lengths_only():
    from fbt_probe.reproduce.config import LONG_KNOBS, PROBE_KNOBS, ReproConfig
    from fbt_probe.training.config import TRAIN_KNOBS

    assert ReproConfig().knobs == PROBE_KNOBS == TRAIN_KNOBS  # the default probes the training lengths
    long = ReproConfig.long_config().knobs
    assert long == LONG_KNOBS and all(set(PROBE_KNOBS[t]) < set(long[t]) or t.startswith("registers") for t in long)
    assert {k for t in long for k in long[t]} - {k for t in PROBE_KNOBS for k in PROBE_KNOBS[t]} == {128, 256}


def test_demo_config_is_the_full_study_lighter():
    """--demo keeps every task, length, stage and the shipped models' seed/steps; it drops only `full`
    and `jacobi:2` on the register tasks, halves (or quarters) the probe groups and lightens the methods."""
    from fbt_probe.reproduce.config import ReproConfig
    from fbt_probe.reproduce.parts.methods import methods_settings

    full, demo = ReproConfig(shipped=True), ReproConfig.demo_config(shipped=True)
    assert (
        demo.knobs == full.knobs
        and (demo.seed, demo.steps) == (full.seed, full.steps)
        and demo.models() == full.models()
    )
    for task, modes in full.modes.items():
        assert demo.modes[task] == [
            m for m in modes if not (task.startswith("registers") and m in ("full", "jacobi:2"))
        ]
        assert 0 < demo.groups[task] < full.groups[task]
    a, b = methods_settings(full), methods_settings(demo)
    assert set(b["das_ks"]) < set(a["das_ks"]) and b["lens_steps"] < a["lens_steps"] and "full" not in b["lens_modes"]
    # every stage but the SAEs, which the demo skips (its report says so)
    from pathlib import Path

    from fbt_probe.reproduce.parts.sae import sections as sae_section
    from fbt_probe.reproduce.pipeline import build_stages

    names = lambda cfg: {s.name for s in build_stages(cfg, Path("unused"))}  # noqa: E731
    assert "sae-feedback" in names(full) and not any(n.startswith("sae") for n in names(demo))
    assert names(demo) < names(full)
    ((title, text, figs),) = sae_section(demo, Path("unused"), [])
    assert "not run in the demo" in text and "fbt-probe sae train" in text and not figs


def test_a_headline_number_is_the_mean_over_seeds_with_its_between_seed_interval():
    import numpy as np
    import pandas as pd

    from fbt_probe.reproduce.seeds import quote

    vals = [0.91, 0.875, 0.955]
    t = pd.DataFrame(
        {
            "model": "feedback",
            "quantity": "answer-accuracy",
            "task": "completion",
            "mode": "standard",
            "value": vals,
            "ci_low": [0.81, 0.7, 0.9],
            "ci_high": [0.97, 0.95, 0.99],
            "seed": [0, 1, 2],
            "study": "demo",
        }
    )
    text = quote(t, "feedback", "answer-accuracy", "completion", "standard", 0)
    half = 4.302652729911275 * np.std(vals, ddof=1) / np.sqrt(3)  # t(0.975, 2 df)
    lo, hi = max(np.mean(vals) - half, 0), min(np.mean(vals) + half, 1)
    assert text == (
        f"**{np.mean(vals):.2f}** [{lo:.2f}, {hi:.2f}] (mean over seeds 0-2: 0.91 / 0.88 / 0.95; seed 0 within run "
        "[0.81, 0.97])"
    )
    # seeds that agree to the quoted digits get no zero-width interval, and one digit apart they do
    same = t.assign(value=[1.0, 0.999, 1.0])
    assert quote(same, "feedback", "answer-accuracy", "completion", "standard", 1) == (
        "**1.00** on every seed (seeds 0-2; seed 1 within run [0.70, 0.95])"
    )
    apart = t.assign(value=[1.0, 0.99, 1.0])
    assert quote(apart, "feedback", "answer-accuracy", "completion", "standard", 0).startswith("**1.00** [0.98, 1.00]")
    from fbt_probe.reproduce.report import seeds_table_text

    table = seeds_table_text(pd.concat([t, t.assign(task="memory", value=1.0)]))
    row = {line.split(" | ")[2]: line for line in table.splitlines() if line.startswith("| feedback")}
    assert row["completion"].endswith(f" | [{lo:.3g}, {hi:.3g}] |") and row["memory"].endswith(" |  |")
    # an accuracy's interval is cut to [0, 1]; a normalized effect's is not (it can leave [0, 1])
    effect = t.assign(quantity="swap-normalized", value=[0.41, 0.49, 0.03])
    m, half = np.mean(effect["value"]), 4.302652729911275 * np.std(effect["value"], ddof=1) / np.sqrt(3)
    assert quote(effect, "feedback", "swap-normalized", "completion", "standard", 0).startswith(
        f"**{m:.2f}** [{m - half:.2f}, {m + half:.2f}] (mean over seeds 0-2: 0.41 / 0.49 / 0.03"
    )
    assert m - half < 0
    # a number the table lacks, or holds for one seed, is said to be one seed's
    own = (0.9, 0.8, 0.95)
    assert quote(t, "baseline", "answer-accuracy", "completion", "standard", 0, own) == (
        "**0.90** [0.80, 0.95] (one seed's: seed 0, within run)"
    )
    assert quote(t.iloc[:1], "feedback", "answer-accuracy", "completion", "standard", 0).endswith(
        "(one seed's: seed 0, within run)"
    )
    assert quote(None, "feedback", "answer-accuracy", "completion", "standard", 0) == "n/a"


def _depth0_numbers(report: str) -> list[float]:
    section = report.split("## Depth-0 decodability")[1].split("## ")[0]
    return [float(x) for x in re.findall(r"\| (\d\.\d{3}) \[", section)]


QUICK = [
    "reproduce",
    "--quick",
    "--steps",
    "8",
]  # the pipeline check, on models trained 8 steps (the quick study's are 60)


@pytest.mark.slow
def test_quick_study_end_to_end(tmp_path):
    out = tmp_path / "repro"
    res = runner.invoke(app, [*QUICK, "--out", str(out)])
    assert res.exit_code == 0, res.output
    table = res.output.split("\nstage ")[1].splitlines()  # the per-stage time table at the end
    state = json.loads((out / "stages.json").read_text())
    assert sorted(ln.split()[0] for ln in table[1:-2]) == sorted(state) and table[-2].startswith("sum run here")
    report = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "fig7a-feedback" in html
    assert (
        "## Attribution patching, DAS and the lens" in report
        and "atp-parity-feedback" in html
        and "lens-baseline" in html
    )
    import pandas as pd

    nums = _depth0_numbers(report)
    assert len(nums) >= 8 and all(0.0 <= x <= 1.0 for x in nums)
    # the SAE stage: two SAEs in SAELens's format, the per-task analyses, the section, the browser, the figures
    from fbt_probe.sae.model import SparseAutoencoder

    sae_dir = out / "results" / "sae" / "feedback"
    assert SparseAutoencoder.load(sae_dir / "jumprelu").cfg.architecture == "jumprelu"
    assert sorted(p.name for p in (sae_dir / "analysis").iterdir()) == [
        "completion",
        "memory",
        "registers",
        "registers-count",
    ]
    assert "### Sparse autoencoders on the carried state" in report and "### Feature browser" in report
    assert (
        all(f"sae-{f}-feedback" in html for f in ("swap", "vs-das", "features")) and "How many features carry" in report
    )
    # feedback − baseline over the samples and pairs both models share: the stage's table, quoted in the findings
    paired = pd.read_parquet(out / "results" / "paired" / "paired.parquet")
    assert {"depth0-recurrent:1", "carried-state", "swap-normalized"} <= set(paired["what"])
    compared = paired["difference"].notna()  # a normalized effect is compared only where both models have the gap
    assert ((paired["ci_low"] <= paired["difference"]) & (paired["difference"] <= paired["ci_high"]))[compared].all()
    assert paired.loc[~compared, "gap"].str.startswith("no gap: ").all()
    assert set(paired.loc[~compared, "what"]) <= {"swap-normalized"}
    assert "(paired, n = " in report.split("## Figures")[0] and "### Feedback − baseline, paired" in report
    # the serial-depth part: its models trained here (the quick study's steps), measured, drawn and stated
    assert {"train-depth-feedback", "train-depth-baseline", "depth"} <= set(state)
    assert "### Serial depth" in report and "<i>depth</i>" in html
    assert "Serial depth (compose-s3" in report.split("## Figures")[0]
    # findings first, then figures, then the tables (collapsed in the HTML)
    assert report.index("## Findings") < report.index("## Figures") < report.index("## Tables")
    assert html.count("<details>") >= 4 and html.index("<h2>Findings</h2>") < html.index("<h2>Figures</h2>")
    text = re.sub(r"<pre>.*?</pre>|<code>.*?</code>|src=\"data:[^\"]*\"", "", html, flags=re.S)
    assert "**" not in text and "`" not in text  # the Markdown is rendered, not shown
    # the first finding's numbers are the eval table's, recomputed here

    from fbt_probe.stats import group_wilson

    acc = pd.read_parquet(out / "eval" / "accuracy.parquet")
    g = acc[(acc["model"] == "feedback") & (acc["task"] == "completion") & (acc["mode"] == "standard")]
    # n = the groups of one length cell (one pair per group and cell; a group recurs at every length)
    assert (g["groups"] == g["n"] // 2).all()
    p, lo, hi = group_wilson(g["correct"].sum() / g["n"].sum(), int(g["groups"].max()))
    assert f"completion **{p:.2f}** [{lo:.2f}, {hi:.2f}]" in report.split("## Figures")[0]
    # a retrained study says how it compares with the shipped models
    assert "differs from the shipped `ref:tiny-feedback`" in report
    assert all(v["status"] == "done" for v in state.values()) and "train-baseline" in state
    again = runner.invoke(app, [*QUICK, "--out", str(out)])
    assert again.exit_code == 0 and again.output.count("[skip]") == len(state)
    # the headline table holds the findings' numbers; a seeds table beside the study (OUT/../seeds.csv,
    # what `--seeds N` writes) redoes only the report, which then quotes the mean and range over seeds
    head = pd.read_csv(out / "headline.csv")
    row = head[
        (head["model"] == "feedback")
        & (head["quantity"] == "answer-accuracy")
        & (head["task"] == "completion")
        & (head["mode"] == "standard")
    ]
    assert len(row) == 1 and abs(row["value"].iloc[0] - p) < 1e-6 and set(head["study"]) == {"quick"}
    # Fig. 7b's numbers too: depth 0 on the register tasks under each probed mode, both models
    regs = head[(head["quantity"] == "depth0-decodability") & (head["task"] == "registers")]
    assert {(m, mode) for m, mode in zip(regs["model"], regs["mode"])} == {
        (m, mode) for m in ("feedback", "baseline") for mode in ("standard", "recurrent:1", "full")
    }
    # the serial-depth tables too, each row with its depth model's hash (not the study model's)
    dep = head[head["quantity"].str.startswith("depth-accuracy-k")]
    assert set(dep["model"]) == {"feedback", "baseline"} and set(dep["task"]) == {"compose-s3"}
    assert not set(dep["checkpoint_sha256"]) & set(head[head["quantity"] == "answer-accuracy"]["checkpoint_sha256"])
    import shutil

    multi = tmp_path / "multi"
    shutil.copytree(out, multi / "seed-0")
    # a stand-in second seed that differs from the first whatever the first reads (the quick model can
    # read 0.00, and seeds that agree are said to agree): the spread's arithmetic is the test
    other = head.assign(seed=1, value=head["value"] * 0.5 + 0.25)
    pd.concat([head, other]).to_csv(multi / "seeds.csv", index=False)
    res = runner.invoke(app, [*QUICK, "--out", str(multi / "seed-0")])
    assert res.exit_code == 0 and res.output.count("[run ]") == 1 and "[run ] report" in res.output, res.output
    seeded = (multi / "seed-0" / "report.md").read_text()
    import numpy as np

    from fbt_probe.reproduce.seeds import between_seeds

    two = np.array([p, p * 0.5 + 0.25])
    blo, bhi = between_seeds(two, True)
    assert (
        f"completion **{two.mean():.2f}** [{blo:.2f}, {bhi:.2f}] (mean over seeds 0-1: {two[0]:.2f} / {two[1]:.2f}; "
        f"seed 0 within run [{lo:.2f}, {hi:.2f}])"
    ) in seeded and "quick study of each" in seeded
    assert "### Over training seeds" in seeded
    # the depth criterion applied to each seed's own table, and the other rules seed by seed
    assert "the criterion on each training seed's own table" in seeded and "training seeds" in seeded
    assert "on every one of the 2 training seeds" in seeded or " of 2 seeds" in seeded


@pytest.mark.slow
def test_checkpoint_path_skips_training(tmp_path, monkeypatch):
    """The paper-1b path on a tiny stand-in checkpoint: the study runs on the given model, no training.
    The command builds the study's config; the pipeline then runs it on two of its tasks (every stage
    of a checkpoint study, at a third of the quick study's cost)."""
    import dataclasses

    import fbt_probe.cli.reproduce as cli_reproduce
    from fbt_probe.formats.checkpoint import save_checkpoint
    from fbt_probe.tasks import build_tokenizer, save_tokenizer

    tok = build_tokenizer()
    ckpt = tmp_path / "standin"
    save_tokenizer(tok, ckpt / "tokenizer.json")
    save_checkpoint(fp.load_model("tiny", d_vocab=tok.get_vocab_size()), ckpt)
    out = tmp_path / "repro"
    seen = []

    def two_tasks(cfg, *args, **kw):
        seen.append(cfg)
        keep = ("completion", "registers")
        cut = {f: {t: v for t, v in getattr(cfg, f).items() if t in keep} for f in ("groups", "knobs", "modes")}
        return real(dataclasses.replace(cfg, **cut, patch_knobs={"completion": [8]}), *args, **kw)

    real = cli_reproduce.reproduce
    monkeypatch.setattr(cli_reproduce, "reproduce", two_tasks)
    args = ["--quick", "--no-methods", "--preset", "paper-1b", "--model", str(ckpt), "--jobs", "1"]
    res = runner.invoke(app, ["reproduce", *args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    (cfg,) = seen  # what the command asked for: the quick study of the checkpoint as it is, every task
    assert cfg.model == str(ckpt) and cfg.preset == "paper-1b" and cfg.quick and not cfg.methods and not cfg.shipped
    assert set(cfg.knobs) == {"completion", "memory", "registers", "registers-count"}
    state = json.loads((out / "stages.json").read_text())
    assert not any(k.startswith("train") for k in state) and "probe-feedback" in state
    assert not any(k.startswith(("methods", "lens")) for k in state)  # --no-methods (the quick study runs them)
    assert len(_depth0_numbers((out / "report.md").read_text())) >= 4


def test_methods_run_every_task_and_report_the_papers_suffix_modes(tmp_path):
    """The methods/lens stages cover the four tasks (registers-count, which the exact experiments leave
    out, at its shortest length), and per-task tables come back under the paper's recurrent:k."""
    import pandas as pd

    from fbt_probe.io import write_json
    from fbt_probe.reproduce.config import ReproConfig
    from fbt_probe.reproduce.parts.methods import methods_knobs, tables

    cfg = ReproConfig()
    # the full study runs the causal experiments at every probe length; the demo at one per task
    assert methods_knobs(cfg) == {
        "completion": [0, 8, 32],
        "memory": [0, 8, 32],
        "registers": [2, 4, 8],
        "registers-count": [1],
    }
    assert methods_knobs(ReproConfig.demo_config()) == {
        "completion": [8],
        "memory": [8],
        "registers": [2],
        "registers-count": [1],
    }
    assert methods_knobs(ReproConfig.quick_config())["registers-count"] == [2]
    for task, suffix in (("memory", None), ("registers", {"1": 3, "2": 5, "4": 9})):
        folder = tmp_path / "results" / "lens" / "feedback" / task
        folder.mkdir(parents=True)
        modes = (
            ["standard", "recurrent:1", "full"] if suffix is None else ["standard", "recurrent:3", "full"]
        )  # as the stage runs them
        pd.DataFrame({"task": task, "mode": modes}).to_parquet(folder / "lens_summary.parquet")
        write_json(
            tmp_path / "data" / f"{task}.manifest.json", {"task": task, **({"suffix_tokens": suffix} if suffix else {})}
        )
    lens = tables(tmp_path, "feedback")["lens"].set_index("task")["mode"]
    assert list(lens["memory"]) == ["standard", "recurrent:1", "full"]  # built-in tokenizer: identity
    assert list(lens["registers"]) == [
        "standard",
        "recurrent:1",
        "full",
    ]  # recurrent:3 = the paper's 1-token suffix here


def test_methods_pairs_are_spread_over_groups():
    """A register group holds several pairs: the methods stages take pairs round-robin over groups so
    that DAS's grouped folds have several groups (the first pair ids would all be one group)."""
    import pandas as pd

    from fbt_probe.reproduce.parts.methods import pairs_over_groups

    pair = [p for p in range(12) for _ in range(2)]
    df = pd.DataFrame({"pair_id": pair, "group_id": [f"g{p // 4}" for p in pair], "length_knob": 2})
    got = pairs_over_groups(df, 5)
    assert sorted(set(got["pair_id"])) == [0, 1, 4, 5, 8]  # round 1: 0, 4, 8; round 2: 1, 5
    assert list(got.index) == sorted(got.index) and (got.groupby("pair_id").size() == 2).all()
    assert len(pairs_over_groups(df, 100)) == len(df)


def test_the_demo_extracts_64_rows_a_forward_and_the_full_studys_extract_key_is_as_before(tmp_path):
    from fbt_probe.reproduce import ReproConfig
    from fbt_probe.reproduce.pipeline import build_stages

    def extract_inputs(cfg):
        return {s.name: s.inputs for s in build_stages(cfg, tmp_path) if s.name.startswith("extract-")}

    demo = ReproConfig.demo_config(preset="tiny", shipped=True)
    full = ReproConfig(preset="tiny", shipped=True)
    assert (demo.extract_batch(), full.extract_batch()) == (64, 16)
    assert all(v["batch"] == 64 for v in extract_inputs(demo).values()) and len(extract_inputs(demo)) == 2
    assert all("batch" not in v and set(v) >= {"modes"} for v in extract_inputs(full).values())


def test_report_markdown_is_rendered_not_escaped():
    from fbt_probe.reproduce.report import _inline, _md_to_html

    out = _md_to_html(
        "A **bold** note on `recurrent:1`.\n\n| model | mode |\n|---|---|\n| **feedback** | `full` <b> |\n"
    )
    assert "<strong>bold</strong>" in out and "<code>recurrent:1</code>" in out
    assert "<td><strong>feedback</strong></td>" in out and "<code>full</code> &lt;b&gt;" in out  # raw HTML stays text
    assert "**" not in out and "`" not in out
    assert (
        _inline("completion **1.00** [0.93, 1.00] under `standard`")
        == "completion <strong>1.00</strong> [0.93, 1.00] under <code>standard</code>"
    )


def test_each_study_kind_is_one_plan_per_task():
    """The four task-keyed fields of a study config come from one TaskPlan per task."""
    from fbt_probe.reproduce.config import DEMO_PLAN, FULL_PLAN, QUICK_PLAN, ReproConfig, TaskPlan, plan_fields

    for cfg, plan in (
        (ReproConfig(), FULL_PLAN),
        (ReproConfig.demo_config(), DEMO_PLAN),
        (ReproConfig.quick_config(), QUICK_PLAN),
    ):
        assert all(isinstance(p, TaskPlan) for p in plan.values())
        fields = plan_fields(plan)
        assert {k: getattr(cfg, k) for k in fields} == fields
        assert list(cfg.modes) == list(cfg.groups) == list(cfg.knobs) == list(plan)
    demo_registers = [p.modes for t, p in DEMO_PLAN.items() if t.startswith("registers")]
    assert demo_registers == [("standard", "recurrent:1", "recurrent:2", "recurrent:4")] * 2  # the suffixes of Fig. 7b
    assert "registers-count" not in ReproConfig().patch_knobs  # a plan without causal lengths leaves the task out
