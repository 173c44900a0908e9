"""`fbt-probe extract`'s progress: a rich bar with ETA over the shards (weighted by samples x
tokens) where a terminal watches, or on --progress; one line per shard otherwise (logs, pipes)."""

from __future__ import annotations

import io
import re

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from fbt_probe.activations import ExtractProgress, extract, shard_cost
from fbt_probe.cli import app
from tests.helpers import make_model
from tests.test_activations import frame
from tests.test_activations_integrity import small_dataset

runner = CliRunner()


@pytest.fixture(scope="module")
def model():
    return make_model(dtype=torch.float64)


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=160), buf


def test_the_bar_moves_with_every_forward_and_ends_complete(model, tmp_path):
    console, buf = _console()
    seen = []

    class Watched(ExtractProgress):
        def batch(self, shard, n_rows):
            super().batch(shard, n_rows)
            seen.append(self.progress.tasks[0].completed)

    df = frame(n_pairs=3)
    with Watched(console) as bar:
        store = extract(
            model, df, ["standard", "recurrent:1"], tmp_path / "acts", batch_size=2, shard_rows=5, progress=bar
        )
    task = bar.progress.tasks[0]
    shards = store.manifest["shards"]
    assert task.total == sum(shard_cost(s) for s in shards) and task.completed == task.total
    assert task.fields["shards"] == f"{len(shards)}/{len(shards)}" and task.finished
    assert len(seen) > len(shards) and seen == sorted(seen)  # several forwards a shard, never backwards
    text = buf.getvalue()
    assert "extract" in text and "100%" in text and "ETA" in text
    # a resumed extraction's finished shards count as done
    (tmp_path / "acts" / "manifest.json").unlink()
    console, _ = _console()
    with ExtractProgress(console) as again:
        extract(model, df, ["standard", "recurrent:1"], tmp_path / "acts", batch_size=2, shard_rows=5, progress=again)
    assert again.progress.tasks[0].completed == again.progress.tasks[0].total


def test_the_command_draws_the_bar_on_request_and_lines_in_a_log(tmp_path):
    data = small_dataset(tmp_path / "data")
    plain = runner.invoke(
        app, ["extract", "tiny", str(data), "--out", str(tmp_path / "a"), "--modes", "standard,recurrent:1"]
    )
    assert plain.exit_code == 0, plain.output
    steps = re.findall(r"^\[(\d+)/(\d+)\] (\S+) +(\S+) +T=(\d+) +(\d+) samples$", plain.output, flags=re.M)
    n = int(steps[0][1])
    assert [int(s[0]) for s in steps] == list(range(1, n + 1)) and {s[2] for s in steps} >= {"standard", "recurrent:1"}
    assert "wrote" in plain.output and "━" not in plain.output  # not a terminal: no bar
    bar = runner.invoke(
        app,
        ["extract", "tiny", str(data), "--out", str(tmp_path / "b"), "--modes", "standard,recurrent:1", "--progress"],
    )
    assert bar.exit_code == 0, bar.output
    assert f"{n}/{n} shards" in bar.output and "100%" in bar.output and "ETA" in bar.output
    assert not re.search(r"^\[\d+/\d+\]", bar.output, flags=re.M) and "wrote" in bar.output
    off = runner.invoke(
        app, ["extract", "tiny", str(data), "--out", str(tmp_path / "c"), "--modes", "standard", "--no-progress"]
    )
    assert off.exit_code == 0 and re.search(r"^\[1/\d+\] standard", off.output, flags=re.M), off.output
