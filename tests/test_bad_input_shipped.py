"""Every command that reads a model, on every shipped model: it runs, or refuses in one line (never a
traceback); and the shipped models' records and names are checked on load."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fbt_probe as fp
from fbt_probe import reference
from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.tasks import build_tokenizer, generate, load_spec, write_dataset
from tests.test_bad_input import one_line_error

runner = CliRunner()
SHIPPED = reference.names()
EXPERIMENTS = [
    "feedback-swap",
    "state-replacement",
    "gate-ablation",
    "residual",
    "probe-direction",
    "attribution",
    "das",
]


def _dataset(root: Path, tok) -> Path:
    df = generate(dataclasses.replace(load_spec("completion"), length_grid=(0,)), groups=2, seed=0, tokenizer=tok)
    write_dataset(df, root / "data", tok)
    return root / "data"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _dataset(tmp_path_factory.mktemp("shipped"), build_tokenizer())


def own_data(name: str, data: Path, tmp_path: Path) -> Path:
    """The dataset in the model's own tokenizer: the shared one, or (a model with a tokenizer of its
    own, the general LMs') one generated in it."""
    from fbt_probe.tasks import load_tokenizer, tokenizer_sha256

    tok = load_tokenizer(reference.folder(f"ref:{name}") / "tokenizer.json")
    if tokenizer_sha256(tok) == tokenizer_sha256(build_tokenizer()):
        return data
    return _dataset(tmp_path / "own", tok)


def commands(ref: str, data: Path, out: Path) -> list[list[str]]:
    few = ["--n-boot", "10", "--no-figures"]
    return [
        ["model", "info", ref],
        ["extract", ref, str(data), "--out", str(out / "acts")],
        *[
            ["patch", ref, str(data), "--experiment", e, "--out", str(out / "patch"), "--ks", "1", "--steps", "2", *few]
            for e in EXPERIMENTS
        ],
        ["lens", ref, str(data), "--steps", "0", "--mode", "standard", "--out", str(out / "lens"), *few],
        ["lens", ref, str(data), "--steps", "0", "--out", str(out / "lens-modes"), *few],
        ["diagnose", "contraction", ref, "--passes", "2", "--rows", "2", "--out", str(out / "diag")],
        ["model", "export-hf", ref, str(out / "hf")],
    ]


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_every_command_runs_or_refuses_in_one_line_on_every_shipped_model(data, tmp_path, name):
    """A latent-feedback model runs every command (export-hf may refuse a config Qwen3 cannot hold);
    a Hidden Decoding model runs the others and is refused by patch, lens and the contraction diagnostic."""
    ref = f"ref:{name}"
    hidden = reference.record(name)["arch"] == "hidden-decoding"
    for args in commands(ref, own_data(name, data, tmp_path), tmp_path):
        res = runner.invoke(app, args)
        if res.exit_code == 0:
            continue
        assert isinstance(res.exception, SystemExit), (args, repr(res.exception))  # never a traceback
        if args[0] in ("patch", "lens") and hidden:
            one_line_error(res, f"{ref}: a hidden-decoding model")
        elif args[0] == "diagnose" and hidden:
            one_line_error(res, "a hidden-decoding model has no feedback passes")
        elif args[0] == "diagnose" and "corpus" in reference.record(name):
            one_line_error(res, f"{ref}: a general language model (trained on a corpus) has no task validation rows")
            assert f"fbt-probe diagnose passes {ref} --out DIR" in res.output
        elif args[:2] == ["model", "export-hf"]:
            one_line_error(res, "only 'none' is a Qwen3 function")
        else:
            raise AssertionError((args, res.output))


def test_patch_and_lens_refuse_a_hidden_decoding_model_in_one_line(data, tmp_path):
    for args in (
        ["patch", "ref:tiny-hidden", str(data), "--experiment", "feedback-swap", "--out", str(tmp_path / "p")],
        ["lens", "ref:tiny-hidden", str(data), "--out", str(tmp_path / "l")],
        ["lens", "ref:tiny-hidden", str(data), "--mode", "standard", "--out", str(tmp_path / "l")],
    ):
        res = runner.invoke(app, args)
        one_line_error(
            res, f"ref:tiny-hidden: a hidden-decoding model (2 streams per token, one pass): `fbt-probe {args[0]}`"
        )
    assert not (tmp_path / "p").exists() and not (tmp_path / "l").exists()


@pytest.fixture
def copied_refs(tmp_path, monkeypatch):
    root = tmp_path / "models"
    shutil.copytree(reference.ROOT, root)
    monkeypatch.setattr(reference, "ROOT", root)
    return root


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda r: r.pop("accuracy"), "field 'accuracy' missing"),
        (lambda r: r.pop("train_seconds"), "field 'train_seconds' missing"),
        (lambda r: r.update(steps="many"), "field 'steps' must be an integer, got str"),
        (lambda r: r.update(baseline=1), "field 'baseline' must be true or false, got int"),
        (lambda r: r["accuracy"]["rows"][0].pop("correct"), "field 'accuracy.rows[0].correct' missing"),
        (lambda r: r["accuracy"].pop("rows"), "field 'accuracy.rows' missing or not a list"),
        (lambda r: r["check"].update(rows={}), "field 'check.rows' missing or not a list"),
        (lambda r: r["accuracy"]["rows"][1].update(n=0), "field 'accuracy.rows[1]' must have 0 <= correct <= n"),
        (lambda r: r["check"]["rows"][0].pop("task"), "field 'check.rows[0].task' missing"),
    ],
)
def test_a_tampered_reference_record_is_one_line(copied_refs, edit, named):
    path = copied_refs / "tiny-feedback" / "reference.json"
    rec = json.loads(path.read_text())
    edit(rec)
    path.write_text(json.dumps(rec))
    res = runner.invoke(app, ["model", "refs"])
    one_line_error(res, f"{path}: {named}")
    assert res.output.rstrip().endswith("; reinstall fbt-probe")
    with pytest.raises(FbtError, match="reinstall fbt-probe"):
        fp.load_model("ref:tiny-feedback")


def test_a_model_may_be_named_by_a_path():
    by_path, by_str = fp.load_model(Path("ref:tiny-feedback")), fp.load_model("ref:tiny-feedback")
    assert by_path.cfg == by_str.cfg
    assert all((a == b).all() for a, b in zip(by_path.state_dict().values(), by_str.state_dict().values()))
    assert fp.load_model(Path("tiny")).cfg == fp.load_model("tiny").cfg
    with pytest.raises(FbtError, match="ref:nope: no such reference model"):
        fp.load_model(Path("ref:nope"))


def test_a_code_running_nanochat_pickle_gets_no_advice_to_run_it(tmp_path):
    import torch

    from fbt_probe.formats.nanochat.checkpoint import read_state

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    path = tmp_path / "model_000001.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(FbtError) as err:
        read_state(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: not a loadable state dict") and "could run code" in msg
    assert "weights_only" not in msg and "can still be loaded" not in msg and "\n" not in msg


def test_an_absurd_context_length_is_refused_by_name(tmp_path):
    from fbt_probe.config import MAX_N_CTX
    from fbt_probe.formats.checkpoint import save_checkpoint
    from fbt_probe.formats.nanochat.checkpoint import import_nanochat
    from tests.helpers import make_model
    from tests.nanochat_helpers import random_state, write_nanochat

    mc, state = random_state(0)
    folder = write_nanochat(tmp_path / "nc", {**mc, "sequence_len": 10**8}, state)
    with pytest.raises(
        FbtError, match=r"field 'model_config.sequence_len' must be at most 1,048,576 .* got 100,000,000"
    ):
        import_nanochat(folder)
    save_checkpoint(make_model(), tmp_path / "ours")
    meta = json.loads((tmp_path / "ours" / "config.json").read_text())
    meta["model"]["n_ctx"] = 10**8
    (tmp_path / "ours" / "config.json").write_text(json.dumps(meta))
    res = runner.invoke(app, ["model", "info", str(tmp_path / "ours")])
    one_line_error(res, f"field 'n_ctx' must be an integer 1..{MAX_N_CTX:,}")


def test_a_long_context_allocates_rope_by_the_input_length():
    """n_ctx bounds the input, not the first allocation: a 3-token forward of a model with the largest
    n_ctx builds a rotary table of EAGER positions, and gives the logits of the same model at n_ctx 128."""
    import torch

    from fbt_probe.config import MAX_N_CTX
    from fbt_probe.model.components import RotaryTable
    from tests.helpers import make_model, tokens

    big, small = make_model(n_ctx=MAX_N_CTX), make_model(n_ctx=128)
    toks = tokens(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(big(toks, mode="jacobi:2"), small(toks, mode="jacobi:2"), rtol=0, atol=1e-12)
    tables = [b.attn.rope for b in big.blocks]
    assert all(cos.shape[0] == RotaryTable.EAGER for t in tables for cos, *_ in t._tables.values())
