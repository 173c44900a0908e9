"""Hostile input on the output markers, tokenizers, task specs and figure tables: one ownership rule
for every command that writes (its `.fbt-output.json` marker alone makes a folder or a file its own),
one writer of a folder at a time, no write or move through a link, tokenizers checked by their ids,
work bounded by what exists, figure tables checked column by column. Each case is refused in one
line with nothing written or deleted, or works; none hangs (the bounds are checked before the work)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from fbt_probe.cli import app
from fbt_probe.errors import FbtError
from fbt_probe.formats.checkpoint import save_checkpoint
from fbt_probe.marker import MARKER, lock_path, read_marker, writing
from fbt_probe.reproduce.stages import Runner, Stage
from fbt_probe.tasks import build_tokenizer, load_tokenizer, save_tokenizer
from fbt_probe.training import TrainConfig, run_training
from tests.helpers import make_model
from tests.test_bad_input import one_line_error, qwen, workdir  # noqa: F401 (the shared fixtures)
from tests.test_force import SMALL, snapshot

runner = CliRunner()


def tree(folder) -> dict:
    """Every file under `folder` (links as what they point to) with its bytes, hidden ones included."""
    return snapshot(folder)


def hidden(parent) -> list[str]:
    """Temporary folders, lock files or half-written files a writer left beside its output."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A training run folder of ours (marker, notes of the user's, train_state.pt, metrics.jsonl)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    run_training(TrainConfig(steps=1, **SMALL), out, progress=False, eval_pairs=2)
    (out / "notes.txt").write_text("the user's notes")
    return out


def copy_of(src, dst):
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


# ----------------------------------------------------------------------------- data loss: one ownership rule
def test_import_nanochat_force_refuses_a_training_run_folder(trained, tmp_path):
    run = copy_of(trained, tmp_path / "run")
    before = tree(run)
    res = invoke("model", "import-nanochat", tmp_path / "nowhere", run, "--no-tokenizer", "--force")
    one_line_error(
        res, f"error: {run}: exists and is not a checkpoint folder written by fbt-probe model import-nanochat"
    )
    assert "its .fbt-output.json marker names fbt-probe train" in res.output
    assert tree(run) == before and hidden(tmp_path) == []


def test_import_hf_force_refuses_a_training_run_folder(trained, qwen, tmp_path):  # noqa: F811
    run = copy_of(trained, tmp_path / "run")
    before = tree(run)
    res = invoke("model", "import-hf", qwen, run, "--force")
    one_line_error(res, f"error: {run}: exists and is not a checkpoint folder written by fbt-probe model import-hf")
    assert tree(run) == before and hidden(tmp_path) == []


@pytest.mark.parametrize("command", ["import-hf", "import-nanochat"])
def test_import_force_refuses_a_users_folder_whose_config_names_our_format(command, qwen, tmp_path):  # noqa: F811
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text(json.dumps({"fbt_probe_format": "fbt-probe/3", "model": {}}))
    (mine / "notes.txt").write_text("mine")
    before = tree(mine)
    source = qwen if command == "import-hf" else tmp_path / "nowhere"
    extra = [] if command == "import-hf" else ["--no-tokenizer"]
    res = invoke("model", command, source, mine, *extra, "--force")
    one_line_error(res, f"error: {mine}: looks like a checkpoint folder written by fbt-probe model {command} written ")
    assert "before fbt-probe marked its outputs" in res.output and "move it away or delete it yourself" in res.output
    assert tree(mine) == before


def test_export_hf_force_refuses_a_users_qwen3_folder(tmp_path):
    mine = tmp_path / "qwen"
    mine.mkdir()
    (mine / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (mine / "README.md").write_text("my model card")
    (mine / "generation_config.json").write_text("{}")
    before = tree(mine)
    res = invoke("model", "export-hf", "tiny", mine, "--force")
    one_line_error(res, f"error: {mine}: looks like a Qwen3-format folder written by fbt-probe model export-hf")
    assert tree(mine) == before and hidden(tmp_path) == []


def test_import_and_export_mark_their_output_and_force_keeps_the_users_files(qwen, tmp_path):  # noqa: F811
    out = tmp_path / "ckpt"
    assert invoke("model", "import-hf", qwen, out).exit_code == 0
    assert read_marker(out)["command"] == "model import-hf" and "model.safetensors" in read_marker(out)["files"]
    (out / "notes.txt").write_text("mine")
    res = invoke("model", "import-hf", qwen, out, "--force", "--seed", "1")
    assert res.exit_code == 0 and "kept 1 file(s) it had not written: notes.txt" in res.output, res.output
    assert (out / "notes.txt").read_text() == "mine"
    export = tmp_path / "exported"
    assert invoke("model", "export-hf", out, export).exit_code == 0
    assert read_marker(export)["command"] == "model export-hf"
    res = invoke("model", "import-hf", qwen, export, "--force")  # another command's output
    one_line_error(res, "its .fbt-output.json marker names fbt-probe model export-hf")


def test_pack_force_refuses_a_folder_holding_a_reference_json(trained, tmp_path):
    toy = tmp_path / "toy"
    toy.mkdir()
    (toy / "reference.json").write_text("{}")
    (toy / "mine.txt").write_text("keep")
    before = tree(toy)
    res = invoke("model", "pack", trained, "--name", "toy", "--out", tmp_path, "--force", "--eval-pairs", "1")
    one_line_error(res, f"error: {toy}: looks like a reference model folder written by fbt-probe model pack")
    assert tree(toy) == before


def test_the_shipped_reference_models_carry_model_packs_marker():
    from fbt_probe.io import sha256_file
    from fbt_probe.reference import ROOT, names

    for name in names():
        record = read_marker(ROOT / name)
        assert record["command"] == "model pack", name
        assert {f: sha256_file(ROOT / name / f) for f in record["files"]} == record["files"]


def test_tasks_generate_force_refuses_a_users_parquet_and_keeps_a_users_tokenizer(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "completion.parquet").write_bytes(b"the user's table")
    before = tree(data)
    res = invoke("tasks", "generate", "completion", "--out", data, "--groups", "2", "--force")
    one_line_error(res, f"error: {data / 'completion.parquet'}: exists and was not written by fbt-probe")
    assert tree(data) == before
    # a user's own tokenizer.json (another tokenizer) is neither replaced by the built-in one nor used
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text(load_tokenizer_text(tmp_path))
    before = tree(other)
    res = invoke("tasks", "generate", "completion", "--out", other, "--groups", "2", "--force")
    one_line_error(res, f"error: {other / 'tokenizer.json'}: exists and was not written by fbt-probe")
    assert tree(other) == before


def load_tokenizer_text(tmp_path) -> str:
    """A tokenizer.json of another tokenizer (the task tokenizer with one word more)."""
    from tokenizers import Tokenizer, models

    vocab = {**build_tokenizer().get_vocab(), "mine": 500}
    return Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).to_str()


def test_tasks_generate_marks_its_files_and_force_replaces_only_them(tmp_path):
    data = tmp_path / "data"
    assert invoke("tasks", "generate", "completion", "--out", data, "--groups", "2").exit_code == 0
    record = read_marker(data)
    assert record["command"] == "named outputs"
    want = ["completion.manifest.json", "completion.parquet", "tokenizer.json"]
    assert sorted(record["files"]) == want and set(record["writers"].values()) == {"tasks generate"}
    (data / "notes.txt").write_text("mine")
    res = invoke("tasks", "generate", "completion", "--out", data, "--groups", "3", "--force")
    assert res.exit_code == 0, res.output
    assert (data / "notes.txt").read_text() == "mine" and read_marker(data)["files"].keys() == set(want)


def test_probe_force_refuses_a_users_summary_csv(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "probes_summary.csv").write_text("the user's summary")
    res = invoke("probe", tmp_path / "acts-never-read", "--out", results, "--force")
    one_line_error(res, f"error: {results / 'probes_summary.csv'}: exists and was not written by fbt-probe")
    assert tree(results) == {"probes_summary.csv": b"the user's summary"}


def test_eval_refuses_to_write_into_an_sae_folder(trained, tmp_path):
    sae = tmp_path / "sae"
    sae.mkdir()
    (sae / "cfg.json").write_text("{}")
    (sae / MARKER).write_text(json.dumps({"command": "sae train", "format": 1, "files": {}}))
    before = tree(sae)
    res = invoke("eval", trained, "--pairs", "1", "--out", sae)
    one_line_error(res, f"error: {sae}: its .fbt-output.json marker names fbt-probe sae train")
    assert "refusing to write accuracy.parquet into it" in res.output and tree(sae) == before


def test_a_named_file_of_another_command_is_not_replaced_by_force(tmp_path):
    from fbt_probe.marker import named_outputs

    out = tmp_path / "o"
    with named_outputs([out / "a.csv"], "eval"):
        (out / "a.csv").parent.mkdir(exist_ok=True)
        (out / "a.csv").write_text("1")
    with pytest.raises(FbtError, match=r"a.csv: written by fbt-probe eval .*not by fbt-probe figures"):
        with named_outputs([out / "a.csv"], "figures", force=True):
            pass
    assert (out / "a.csv").read_text() == "1"


HOLD = """
import sys, time
from fbt_probe.marker import writing
with writing(sys.argv[1], "test"):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture()
def held(tmp_path):
    """Hold an output's writer lock from another process (as a second command running would)."""
    procs = []

    def hold(path):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
        p = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield hold
    for p in procs:
        p.stdin.close()
        p.wait(timeout=60)


def test_a_second_writer_of_a_folder_is_refused_while_the_first_writes(held, workdir, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    held(out)
    for args in (
        ["lens", workdir / "run", workdir / "data", "--out", out, "--steps", "1"],
        ["sae", "train", workdir / "run", workdir / "data", "--out", out, "--steps", "1"],
        ["train", "--out", out, "--steps", "1", "--tasks", "completion", "--tokens-per-step", "200", "--warmup", "1"],
        ["tasks", "generate", "completion", "--out", out, "--groups", "2"],
    ):
        res = invoke(*args)
        one_line_error(res, f"error: {out}: another fbt-probe command is writing it now")
        assert not out.exists(), args


def test_the_lock_of_a_finished_writer_is_gone_and_a_killed_one_is_released(tmp_path):
    out = tmp_path / "out"
    with writing(out, "test"):
        assert lock_path(out).exists()
        with writing(out, "test"):  # nested holders in one process share it
            pass
    assert not lock_path(out).exists() and hidden(tmp_path) == []
    code = textwrap.dedent(HOLD).replace('print("held", flush=True)', "import os; os._exit(9)")
    subprocess.run([sys.executable, "-c", code, str(out)], env={**os.environ, "PYTHONPATH": os.getcwd()})
    with writing(out, "test"):  # a killed writer's lock went with its process
        pass


def test_two_train_runs_into_one_folder_do_not_both_write(held, tmp_path):
    out = tmp_path / "run"
    held(out)  # the first run is training there
    args = ["train", "--out", out, "--steps", "1", "--tasks", "completion", "--tokens-per-step", "200"]
    one_line_error(invoke(*args, "--warmup", "1"), "another fbt-probe command is writing it now")
    assert not out.exists()


# ----------------------------------------------------------------------------- security: no write through a link
def test_an_extract_rerun_refuses_a_link_in_its_folder(tmp_path):
    from fbt_probe.activations import extract
    from tests.test_activations import frame

    out, outside = tmp_path / "acts", tmp_path / "outside"
    outside.mkdir()
    done = []

    def stop(shard):
        done.append(shard)
        raise KeyboardInterrupt

    model = make_model(dtype=torch.float64)
    with pytest.raises(KeyboardInterrupt):  # killed after its first shard
        extract(model, frame(), ["standard", "recurrent:1"], out, shard_rows=4, on_shard=stop)
    mode = out / "shards" / "recurrent_1"
    if mode.exists():
        import shutil

        shutil.rmtree(mode)
    mode.symlink_to(outside, target_is_directory=True)
    with pytest.raises(FbtError, match=rf"^{mode}: a symbolic link to a folder .*refusing to write, move or delete"):
        extract(model, frame(), ["standard", "recurrent:1"], out, shard_rows=4)
    assert list(outside.iterdir()) == []


def test_a_redone_study_stage_refuses_a_link_to_a_users_folder(tmp_path):
    from tests.test_bad_input_outputs import write_stage

    out, users = tmp_path / "study", tmp_path / "users"
    users.mkdir()
    (users / "precious.txt").write_text("the user's")
    target = out / "data"
    Runner(out, echo=lambda _: None).run(Stage("data", {"v": 1}, [target], write_stage(target, "old")))
    (target / "sub").symlink_to(users, target_is_directory=True)
    with pytest.raises(FbtError, match=rf"^{target / 'sub'}: a symbolic link to a folder"):
        Runner(out, force={"data"}, echo=lambda _: None).run(
            Stage("data", {"v": 1}, [target], write_stage(target, "new"))
        )
    (target / "sub").unlink()
    import shutil

    shutil.rmtree(target)
    target.symlink_to(users, target_is_directory=True)  # the stage's folder itself a link
    with pytest.raises(FbtError, match=rf"^{target}: a symbolic link"):
        Runner(out, force={"data"}, echo=lambda _: None).run(
            Stage("data", {"v": 1}, [target], write_stage(target, "new"))
        )
    assert tree(users) == {"precious.txt": b"the user's"}


def test_an_output_folder_that_is_a_link_is_refused(workdir, tmp_path):  # noqa: F811
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    res = invoke("lens", workdir / "run", workdir / "data", "--out", link, "--steps", "1")
    one_line_error(res, f"error: {link}: a symbolic link (to {real}); refusing to write through a link")
    assert list(real.iterdir()) == []
    res = invoke("figures", "depth-grid", tmp_path / "t.csv", "--out", link)
    one_line_error(res, f"error: {link}: a symbolic link (to {real}); refusing to write through a link")


def test_force_refuses_a_link_inside_its_output_that_points_outside(qwen, tmp_path):  # noqa: F811
    out = tmp_path / "ckpt"
    assert invoke("model", "import-hf", qwen, out).exit_code == 0
    (tmp_path / "elsewhere.txt").write_text("the user's")
    (out / "escape").symlink_to(tmp_path / "elsewhere.txt")
    res = invoke("model", "import-hf", qwen, out, "--force")
    one_line_error(res, f"error: {out / 'escape'}: a symbolic link to a path outside {out}")
    assert (tmp_path / "elsewhere.txt").read_text() == "the user's" and (out / "escape").is_symlink()


# ----------------------------------------------------------------------------- tokenizers: by their ids
def far_id_tokenizer(path):
    """The task tokenizer's words, 'Status' moved to id 5000: as many ids as before, one far past them."""
    from tokenizers import Tokenizer, models

    vocab = build_tokenizer().get_vocab()
    vocab["Status"] = 5000
    tok = build_tokenizer()
    far = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    far.pre_tokenizer = tok.pre_tokenizer
    return save_tokenizer(far, path)


def test_a_tokenizer_whose_largest_id_is_past_the_embedding_is_refused(qwen, workdir, tmp_path):  # noqa: F811
    far = far_id_tokenizer(tmp_path / "far" / "tokenizer.json")
    assert load_tokenizer(far).get_vocab_size() < 128  # the count alone fits
    res = invoke("model", "import-hf", qwen, tmp_path / "ckpt", "--tokenizer", far)
    one_line_error(res, f"error: {far}: the tokenizer's largest id is 5,000 ('Status'), but the checkpoint's embedding")
    assert not (tmp_path / "ckpt").exists()
    run = tmp_path / "run"
    save_checkpoint(make_model(dtype=torch.float32), run, tokenizer_path=far)  # as an older import left it
    res = invoke("lens", run, workdir / "data", "--out", tmp_path / "lens", "--steps", "1")
    one_line_error(res, f"error: {run / 'tokenizer.json'}: the tokenizer's largest id is 5,000 ('Status')")
    assert not (tmp_path / "lens").exists()


def test_a_template_id_past_the_embedding_is_refused(tmp_path):
    from tokenizers import processors

    from fbt_probe.tasks import check_tokenizer_fits

    tok = build_tokenizer()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 9000)])
    with pytest.raises(FbtError, match=r"^t: the tokenizer's template adds the id 9,000 \(a BOS or EOS\)"):
        check_tokenizer_fits(tok, 128, "t")


def test_tasks_generate_refuses_a_tokenizer_with_an_empty_vocabulary(tmp_path):
    from tokenizers import Tokenizer, models

    empty = tmp_path / "empty.json"
    empty.write_text(Tokenizer(models.WordLevel({}, unk_token="<unk>")).to_str())
    res = invoke("tasks", "generate", "completion", "--out", tmp_path / "d", "--tokenizer", empty)
    one_line_error(res, f"error: {empty}: the tokenizer has an empty vocabulary (no token ids)")
    assert not (tmp_path / "d").exists()


def _pickle_of(state) -> bytes:
    body = pickle.dumps(state, protocol=4)[2:-1]
    return b"\x80\x04\x8c\x0dtiktoken.core\x8c\x08Encoding\x93)\x81" + body + b"b."


def test_a_huge_single_token_pickle_is_refused_before_its_merges_and_leaves_no_folder(tmp_path):
    from tests.nanochat_helpers import random_state, write_nanochat

    ranks = {bytes([b]): b for b in range(256)}
    ranks[b"x" * 1_500_000] = 256  # one 1.5 MB token: every split of it would be a merge to enumerate
    pkl = tmp_path / "tok" / "tokenizer.pkl"
    pkl.parent.mkdir()
    pkl.write_bytes(_pickle_of({"name": "x", "pat_str": ".", "mergeable_ranks": ranks, "special_tokens": {}}))
    mc, state = random_state(0, vocab_size=257)
    ckpt = write_nanochat(tmp_path / "ckpt", mc, state)
    out = tmp_path / "runs" / "imported"
    res = invoke("model", "import-nanochat", ckpt, out, "--tokenizer", pkl)
    one_line_error(res, f"error: {pkl}: field 'mergeable_ranks': the token of rank 256 is 1,500,000 bytes")
    assert not out.exists() and not (tmp_path / "runs").exists()  # no temporary folder, no lock, no parent


def test_a_pickle_of_another_id_count_is_refused_before_it_is_converted(tmp_path, monkeypatch):
    from fbt_probe.formats.nanochat import tokenizer as nt
    from tests.nanochat_helpers import random_state, write_nanochat

    ranks = {bytes([b]): b for b in range(256)}
    pkl = tmp_path / "tokenizer.pkl"
    pkl.write_bytes(_pickle_of({"name": "x", "pat_str": ".", "mergeable_ranks": ranks, "special_tokens": {}}))
    mc, state = random_state(0, vocab_size=300)
    ckpt = write_nanochat(tmp_path / "ckpt", mc, state)

    def never(*a, **k):
        raise AssertionError("converted before the id count was compared")

    monkeypatch.setattr(nt, "merges_of", never)
    res = invoke("model", "import-nanochat", ckpt, tmp_path / "o", "--tokenizer", pkl)
    one_line_error(res, "the tokenizer has 256 ids, fewer than the checkpoint's vocab_size 300")


def test_a_pickle_too_large_to_be_a_tokenizer_is_refused_unread(tmp_path, monkeypatch):
    from fbt_probe.formats.nanochat import tokenizer as nt

    big = tmp_path / "tokenizer.pkl"
    big.write_bytes(b"\0" * 2048)
    monkeypatch.setattr(nt, "MAX_PICKLE_BYTES", 1024)
    with pytest.raises(FbtError, match=r"more than a tokenizer pickle holds \(at most 0 MiB\); refused unread"):
        nt.read_pickle(big)


# ----------------------------------------------------------------------------- task specs and work bounded by what exists
def test_a_compose_spec_with_a_float_in_a_permutation_is_refused(tmp_path):
    from fbt_probe.tasks.spec import builtin_spec_paths

    spec = json.loads(builtin_spec_paths()["compose-s3"].read_text())
    spec["permutations"][0] = [1.0, 0, 2]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    res = invoke("tasks", "generate", path, "--out", tmp_path / "d")
    one_line_error(res, "field 'permutations'")
    assert "distinct permutations of one set 0..n-1" in res.output and not (tmp_path / "d").exists()


@pytest.mark.parametrize("task", ["completion", "compose-s3"])
def test_tasks_generate_refuses_a_billion_groups_at_once(task, tmp_path):
    res = invoke("tasks", "generate", task, "--out", tmp_path / "d", "--groups", "1000000000")
    one_line_error(res, "error: --groups: expected an integer 1..100000 (structural groups), got 1000000000")
    assert not (tmp_path / "d").exists()


def test_groups_beyond_what_a_spec_can_produce_are_capped_with_a_note(tmp_path):
    from fbt_probe.tasks.spec import builtin_spec_paths

    spec = json.loads(builtin_spec_paths()["completion"].read_text()) | {"length_grid": [0]}
    (tmp_path / "completion.json").write_text(json.dumps(spec))
    res = invoke("tasks", "generate", tmp_path / "completion.json", "--out", tmp_path / "d", "--groups", "5000")
    assert res.exit_code == 0, res.output
    assert (
        "note: completion: --groups 5,000 is more than the distinct groups the spec can produce (91); capped at that"
        in res.output
    )
    assert pd.read_parquet(tmp_path / "d" / "completion.parquet")["group_id"].nunique() == 91


@pytest.mark.parametrize(
    "pairs, match",
    [
        ("1000000000", "--pairs 1000000000: expected an integer 1..100000"),
        ("100000000000000000000000", "--pairs 100000000000000000000000: expected an integer 1..100000"),
        ("0", "--pairs 0: expected an integer 1..100000 (held-out minimal pairs per task x length cell)"),
    ],
)
def test_eval_pairs_are_bounded_before_any_work(pairs, match, trained, tmp_path):
    res = invoke("eval", trained, "--pairs", pairs, "--out", tmp_path / "e")
    one_line_error(res, f"error: {match}")
    assert not (tmp_path / "e").exists()


# ----------------------------------------------------------------------------- figure tables, column by column
def grid_rows(**change) -> pd.DataFrame:
    row = dict(design="compose-s3", schedule="paper", model="feedback", seed=0, k=2, mode="standard")
    row |= dict(accuracy=0.5, ci_low=0.3, ci_high=0.7, groups=8)
    return pd.DataFrame([row, {**row, "k": 4}]).assign(**change)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(k=[2.5, 4]), "column 'k', row 0: 2.5: expected an integer 1..65,536"),
        (dict(accuracy=[7.5, 0.5]), "column 'accuracy', row 0: 7.5: expected a number in [0, 1]"),
        (dict(seed=["zero", "zero"]), "column 'seed', row 0: 'zero': expected an integer 0.."),
        (dict(k=["two", "four"]), "column 'k', row 0: 'two': expected an integer 1..65,536"),
        (dict(seed=[None, 0]), "column 'seed', row 0: an empty field: expected an integer 0.."),
        (dict(k=[0, 4]), "column 'k', row 0: 0: expected an integer 1..65,536"),
        (dict(k=[-4, 4]), "column 'k', row 0: -4: expected an integer 1..65,536"),
        (dict(k=[1e300, 4]), "column 'k', row 0: 1e+300: expected an integer 1..65,536"),
        (dict(groups=["many", "many"]), "column 'groups', row 0: 'many': expected an integer 0.."),
    ],
    ids=["k-2.5", "accuracy-7.5", "text-seed", "text-k", "empty-seed", "k-0", "k-minus-4", "k-1e300", "text-groups"],
)
def test_depth_grid_refuses_a_bad_field_in_one_line(change, match, tmp_path):
    table = tmp_path / "grid.csv"
    grid_rows(**change).to_csv(table, index=False)
    res = invoke("figures", "depth-grid", table, "--out", tmp_path / "figs")
    one_line_error(res, f"error: figure 'depth-grid': {match}")
    assert not (tmp_path / "figs").exists()


def test_depth_grid_refuses_a_header_only_table_and_forty_thousand_panels(tmp_path):
    table = tmp_path / "grid.csv"
    table.write_text(",".join(grid_rows().columns) + "\n")
    res = invoke("figures", "depth-grid", table, "--out", tmp_path / "figs")
    one_line_error(res, "error: figure 'depth-grid': the table has no rows (a header only?); nothing to draw")
    one = grid_rows().iloc[0].to_dict()
    many = pd.DataFrame([{**one, "design": f"d{i}", "seed": s} for i in range(200) for s in range(200)])
    many.to_csv(table, index=False)
    res = invoke("figures", "depth-grid", table, "--out", tmp_path / "figs")
    one_line_error(res, "error: figure 'depth-grid': 40,000 panels (200 runs x 200 seeds); expected at most 400")
    assert not (tmp_path / "figs").exists()


def test_the_depth_figure_checks_its_tables_too():
    from fbt_probe.figures import draw

    t = grid_rows().drop(columns=["design", "schedule", "seed"])
    with pytest.raises(FbtError, match=r"^figure 'depth': column 'k', row 1: 0.5: expected an integer"):
        draw("depth", t.assign(k=[2, 0.5]))


# ----------------------------------------------------------------------------- model cards
def test_a_pack_note_is_one_line_of_literal_text(trained, tmp_path):
    res = invoke("model", "pack", trained, "--name", "toy", "--out", tmp_path, "--note", "fine\n# not a heading")
    one_line_error(res, "error: --note: expected one line of text (it is printed in bold before the card's numbers)")
    assert not (tmp_path / "toy").exists()
    note = "# a *claim* with `code` and a | pipe"
    res = invoke("model", "pack", trained, "--name", "toy", "--out", tmp_path, "--note", note, "--eval-pairs", "1")
    assert res.exit_code == 0, res.output
    card = (tmp_path / "toy" / "card.md").read_text()
    assert r"**\# a \*claim\* with \`code\` and a \| pipe**" in card.splitlines()
    assert read_marker(tmp_path / "toy")["command"] == "model pack"


# ----------------------------------------------------------------------------- reproduce on a user's run
def test_a_study_of_a_run_trained_on_some_tasks_studies_those_and_says_which_were_left_out(tmp_path):
    from fbt_probe.reproduce.config import ReproConfig, for_trained_tasks, training_note
    from fbt_probe.reproduce.parts.data import stage_data
    from fbt_probe.reproduce.pipeline import build_stages, reproduce

    run = tmp_path / "run"
    two = dict(SMALL, tasks=("completion", "memory"), knobs={"completion": [0], "memory": [8]})
    run_training(TrainConfig(steps=1, **two), run, progress=False, eval_pairs=2)
    cfg, left = for_trained_tasks(ReproConfig.demo_config(model=str(run)))
    assert left == ["registers", "registers-count"] and list(cfg.knobs) == ["completion", "memory"]
    assert "left out of the study: registers, registers-count (not trained on them)" in training_note(cfg)
    assert not [s.name for s in build_stages(cfg, tmp_path / "study") if "register" in s.name]
    # every check a study makes before its first stage passes (the recipe's four-task shares stopped it)
    with pytest.raises(FbtError, match=r"^--force bogus: unknown stage \(stages: data, "):
        reproduce(cfg, tmp_path / "study", force={"bogus"})
    stage_data(cfg, tmp_path / "study")  # stopped here before: "registers: no group can be produced"
    assert sorted(p.name for p in (tmp_path / "study" / "data").glob("*.parquet")) == [
        "completion.parquet",
        "memory.parquet",
    ]


def test_reproduce_refuses_an_out_inside_the_model_and_model_with_train(trained):
    out = trained / "study"
    one_line_error(
        invoke("reproduce", "--model", trained, "--out", out),
        f"error: --out {out}: inside --model {trained}; the study would write into the checkpoint's folder",
    )
    one_line_error(
        invoke("reproduce", "--model", trained, "--train", "--out", trained.parent / "s"),
        f"error: --model {trained} --train: --train trains the study's own models, --model studies a checkpoint",
    )
    assert not out.exists() and not (trained.parent / "s").exists()


# ----------------------------------------------------------------------------- minimal pairs under any tokenizer
@pytest.fixture(scope="module")
def bpes():
    from tests.tokenizer_helpers import digit_bpe

    return {"every digit": digit_bpe(True), "12 and 13 split": digit_bpe(False)}


def exact(df) -> bool:
    ids = list(df["token_ids"])
    return all(len(a) == len(b) and a[-1] == b[-1] for a, b in zip(ids[::2], ids[1::2]))


@pytest.mark.parametrize("kind", ["every digit", "12 and 13 split"])
def test_every_built_in_task_generates_exact_pairs_under_a_bpe_that_splits_numbers(kind, bpes):
    import warnings

    from fbt_probe.tasks import generate
    from fbt_probe.tasks.spec import builtin_spec_paths

    for name in builtin_spec_paths():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            df = generate(name, groups=6, tokenizer=bpes[kind], tokenizer_name="the BPE")
        assert exact(df), name
        notes = [str(w.message) for w in caught if "length depends on the count" in str(w.message)]
        assert bool(notes) == (name == "completion"), (name, notes)


def test_completion_under_a_digit_splitting_bpe_draws_counts_of_one_length_and_says_so(bpes, tmp_path):
    from fbt_probe.tasks.spec import builtin_spec_paths

    tok = save_tokenizer(bpes["every digit"], tmp_path / "bpe.json")
    spec = json.loads(builtin_spec_paths()["completion"].read_text()) | {"length_grid": [0, 8]}
    completion = tmp_path / "completion.json"
    completion.write_text(json.dumps(spec))
    res = invoke("tasks", "generate", completion, "--out", tmp_path / "d", "--tokenizer", tok)
    assert res.exit_code == 0, res.output
    assert (
        f"note: completion: under tokenizer {tok} the header's length depends on the count (with 0-9: 14 tokens; "
        "with 10-13: 15 tokens); only groups whose two counts have the same length are drawn" in res.output
    )
    df = pd.read_parquet(tmp_path / "d" / "completion.parquet")
    assert exact(df) and df["group_id"].nunique() == 45 + 6  # {a, b} both of 0-9, or both of 10-13
    res = invoke("tasks", "generate", completion, "--out", tmp_path / "e", "--tokenizer", bpes_path(bpes, tmp_path))
    assert res.exit_code == 0 and "(with 0-11: 14 tokens; with 12-13: 15 tokens)" in res.output, res.output


def bpes_path(bpes, tmp_path):
    return save_tokenizer(bpes["12 and 13 split"], tmp_path / "bpe12.json")


def test_a_pair_the_generator_cannot_keep_exact_is_refused_naming_its_pieces(bpes, monkeypatch, tmp_path):
    from fbt_probe.tasks import generate, generators, load_spec

    tok = bpes["every digit"]
    monkeypatch.setattr(generators, "count_widths", lambda spec, tok: None)  # as before: counts drawn blind
    with pytest.raises(FbtError) as err:  # the two shortest lengths: a pair of counts of two widths is among them
        generate(
            load_spec("completion").replace(length_grid=[0, 8]), groups=80, tokenizer=tok, tokenizer_name="the BPE"
        )
    msg = err.value.message
    assert msg.startswith("completion: pair ") and "is not exact under the BPE: its samples have" in msg
    assert "differing in" in msg and "'1' '" in msg and "\n" not in msg
    monkeypatch.undo()
    spec = load_spec("completion").replace(value_range=[9, 10])  # one pair of counts, of two lengths
    with pytest.raises(FbtError, match=r"no two counts of field 'value_range' give the header one length"):
        generate(spec, tokenizer=tok, tokenizer_name="the BPE")


# ----------------------------------------------------------------------------- the other writers: corpus, bench
def test_corpus_pin_and_fetch_write_nothing_of_the_users(tmp_path):
    mine = tmp_path / "files.tsv"
    mine.write_text("the user's list")
    res = invoke("corpus", "pin", "--src", tmp_path / "src-never-read", "--out", mine, "--force")
    one_line_error(res, f"error: {mine}: exists and was not written by fbt-probe")
    assert mine.read_text() == "the user's list"
    built = tmp_path / "corpus"
    built.mkdir()
    (built / MARKER).write_text(json.dumps({"command": "corpus build", "format": 1, "files": {}}))
    res = invoke("corpus", "fetch", "--dir", built)  # refused before pip is run
    one_line_error(res, f"error: {built}: its .fbt-output.json marker names fbt-probe corpus build")
    assert [p.name for p in built.iterdir()] == [MARKER]


def test_a_benchmark_report_replaces_only_its_own_files(tmp_path):
    report = tmp_path / "probes.md"
    report.write_text("the user's notes")
    args = ["bench", "probes", "--n", "8", "--d", "2", "--depths", "1", "--folds", "2", "--out", report]
    one_line_error(invoke(*args, "--force"), f"error: {report}: exists and was not written by fbt-probe")
    assert report.read_text() == "the user's notes"
    report.unlink()
    assert invoke(*args).exit_code == 0
    record = read_marker(tmp_path)
    assert record["writers"] == {"probes.md": "bench", "probes.md.json": "bench"}
    assert invoke(*args, "--force").exit_code == 0  # its own files, unchanged
