"""`fbt-probe bench model` and `bench patch`: they run, report what they claim, refuse bad input in
one line. (Speed itself is measured, not tested: BENCHMARKS.md.)"""

import json

import pytest
from typer.testing import CliRunner

from fbt_probe.cli import app

runner = CliRunner()


def test_bench_model_reports_ratios(tmp_path):
    out = tmp_path / "model.md"
    res = runner.invoke(
        app,
        [
            "bench",
            "model",
            "--seq",
            "24",
            "--full-batches",
            "2,1",
            "--cache-seq",
            "16",
            "--repeats",
            "1",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "model.md.json").read_text())
    assert [f["batch"] for f in r["prefill"]["full"]] == [2, 1]
    # the reported ratios are the reported times' (identities; no claim about which is faster, which
    # a loaded machine can turn around)
    for f in r["prefill"]["full"]:
        assert f["full_s"] > 0 and f["standard_s"] > 0
        assert f["full_over_standard"] == pytest.approx(f["full_s"] / f["standard_s"])
        assert f["per_step_ms"] == pytest.approx(f["full_s"] / (24 - 1) * 1e3)
    assert {"standard", "full"} == set(r["prefill"]["peak_memory"])
    assert r["prefill"]["peak_memory"]["standard"]["rss_mb"] > 50  # a Python process holding torch
    assert r["cache"]["all_over_plain"] > 0 and r["provenance"]["git_commit"]
    assert "per serial step" in out.read_text() and "every hook" in out.read_text()


@pytest.mark.slow
def test_bench_patch_runs_the_commands_and_compares_reuse(tmp_path):
    import dataclasses

    from fbt_probe.tasks import build_tokenizer, generate, load_spec, write_dataset

    data, tok = tmp_path / "data", build_tokenizer()  # two groups at lengths 0 and 8: what `tasks generate` writes
    df = generate(dataclasses.replace(load_spec("completion"), length_grid=(0, 8)), groups=2, seed=0, tokenizer=tok)
    write_dataset(df, data, tok)
    res = runner.invoke(
        app,
        [
            "bench",
            "patch",
            "--dataset",
            str(data),
            "--experiments",
            "feedback-swap,residual",
            "--compare-pairs",
            "1",
            "--out",
            str(tmp_path / "patch.md"),
        ],
    )
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "patch.md.json").read_text())
    assert [c["experiment"] for c in r["commands"]] == ["feedback-swap", "residual"]
    assert all(c["exit_code"] == 0 and c["peak_rss_mb"] > 50 for c in r["commands"]), r["commands"]
    assert r["samples"] == len(df) and r["tokens"] == [df["n_tokens"].min(), df["n_tokens"].max()]
    t = r["together"]  # both in one command: the same tables (same shapes, so rounding at most)
    assert (
        t["exit_code"] == 0 and "--experiment feedback-swap,residual" in t["command"] and t["max_summary_diff"] < 1e-6
    ), t
    for c in r["compare"]:  # float32: reuse and the full re-run agree to rounding
        assert c["max_summary_diff"] < 1e-3 and c["speedup"] > 0, c


def test_bench_nnsight_checks_each_value_and_reports_the_ratio(tmp_path):
    out = tmp_path / "nn.md"
    res = runner.invoke(app, ["bench", "nnsight", "--batch", "2", "--seq", "6", "--repeats", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "nn.md.json").read_text())
    assert [(c["mode"], c["serial"]) for c in r["cases"]] == [("recurrent:1", False), ("full", True)]
    for c in r["cases"]:
        assert c["max_abs_diff"] < 1e-5  # nnsight read the same values (the serial chunks in order)
        assert c["nnsight_over_run_with_cache"] == pytest.approx(c["nnsight_s"] / c["run_with_cache_s"])
    assert "tracer.iter" in out.read_text() and r["hook"] == "blocks.2.hook_resid_post"  # the middle of 4


@pytest.mark.parametrize(
    "args,match",
    [
        (["model", "--full-batches", "x"], "--full-batches"),
        (["model", "--seq", "1"], "--seq"),
        (["model", "--device", "tpu"], "--device"),
        (["patch", "--experiments", "nope"], "--experiments"),
        (["patch", "--mode", "fulll"], "mode"),
        (["patch", "--dataset", "/no/such/dataset"], "no such dataset"),
        (["nnsight", "--seq", "1"], "--seq"),
        (["nnsight", "--layer", "9"], "--layer 9"),
    ],
)
def test_bench_bad_input_is_one_line(args, match):
    res = runner.invoke(app, ["bench", *args])
    assert res.exit_code == 2 and match in res.output and res.output.strip().count("\n") == 0, res.output


@pytest.mark.gpu
def test_bench_model_on_cuda_times_full_with_and_without_the_graph(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "model-gpu.md"
    res = runner.invoke(
        app,
        [
            "bench",
            "model",
            "--device",
            "cuda",
            "--seq",
            "64",
            "--full-batches",
            "2",
            "--batch",
            "2",
            "--cache-seq",
            "16",
            "--repeats",
            "1",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "model-gpu.md.json").read_text())
    f = r["prefill"]["full"][0]
    assert r["device"] == "cuda" and f["eager_full_s"] > 0 and f["graph_speedup"] > 0
    assert r["prefill"]["peak_memory"]["full"]["rss_mb"] > 0
    assert "CUDA graph" in out.read_text() and "eager lean step" in out.read_text()


def test_diff_reports_tolerates_one_unit_in_the_last_place_and_nothing_else(tmp_path):
    def report(body: str):
        p = tmp_path / f"r{len(list(tmp_path.iterdir()))}.md"
        p.write_text(f"# r\n## Findings\nx 1.0\n## Tables\n{body}\n## What was run\ncommit abc 12.5 s\n")
        return str(p)

    base = report("| completion | 0.758 [0.66, 0.86] | 1,544 | −0.012 |")

    def rc(body):
        return runner.invoke(app, ["bench", "diff-reports", base, report(body)]).exit_code

    assert rc("| completion | 0.758 [0.66, 0.86] | 1,544 | −0.012 |") == 0
    assert rc("| completion | 0.759 [0.67, 0.86] | 1,545 | −0.011 |") == 0  # one unit each
    assert rc("| completion | 0.760 [0.66, 0.86] | 1,544 | −0.012 |") == 1  # two units
    assert rc("| memory | 0.758 [0.66, 0.86] | 1,544 | −0.012 |") == 1  # text
    assert rc("| completion | 0.758 [0.66, 0.86] | 1,544 |") == 1  # a token missing
    res = runner.invoke(app, ["bench", "diff-reports", base, str(tmp_path / "none.md")])
    assert res.exit_code == 2 and "report not found" in res.output and res.output.strip().count("\n") == 0
