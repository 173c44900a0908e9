"""The runner every experiment's forwards go through (`fbt_probe.interventions.forwards.Forwards`):
each way it runs a claim (from a prefix, a partner batch in place, replicas, a held prefix, the Soft
prompt from the recurrent:1 prefix) equals the whole-sequence reference in float64, and it builds
exactly the prefixes it says it builds."""

import pytest
import torch

from fbt_probe.engine import prefix as prefix_module
from fbt_probe.hooks import depth_name
from fbt_probe.interventions import forwards as F
from fbt_probe.interventions.edits import patch_rows_at, set_at
from fbt_probe.interventions.forwards import Forwards, final_logits, pairs_up, soft_answer_logits
from fbt_probe.modes import parse_mode
from tests.helpers import make_model, tokens

pytestmark = pytest.mark.usefixtures("one_thread")
B, T = 6, 11
PARTNER = torch.tensor([1, 0, 3, 2, 5, 4])  # pairs: (0, 1), (2, 3), (4, 5)
MODES = ["recurrent:1", "recurrent:3", "full", "jacobi:2"]


@pytest.fixture(scope="module")
def model():
    return make_model()  # float64


@pytest.fixture(scope="module")
def toks():
    return tokens(B, T, vocab=64)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


def values(model, n=B, seed=0):
    return torch.randn(n, model.cfg.d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("mode", MODES)
def test_partner_rows_in_place_equal_the_partner_batch_run_whole(model, toks, mode, monkeypatch):
    """rows=partner with a per-row edit runs the batch as it is (no prefix copied) with the edit's
    values in partner order; row j of the answer is the partner of j run with value j."""
    mode = parse_mode(mode)
    hooks = [("fusion.hook_feedback", set_at(values(model), T - 1, model))]
    selected = []
    real = prefix_module.Prefix.select
    monkeypatch.setattr(prefix_module.Prefix, "select", lambda self, rows: selected.append(1) or real(self, rows))
    fw = Forwards(model)
    got = fw.final_logits(toks, mode, hooks, edit_from=T - 1, rows=PARTNER)
    assert selected == [] and fw.builds == 1  # in place: the batch's own prefix, no copy
    close(got, final_logits(model, toks[PARTNER], mode, hooks))


@pytest.mark.parametrize("mode", ["recurrent:1", "jacobi:2"])
def test_rows_that_do_not_pair_up_and_replicas_run_a_copied_prefix(model, toks, mode):
    """A permutation that is not a set of swaps, and n replicas of it (replica-major), equal the
    whole run of tokens[rows].repeat(n, 1)."""
    mode, rows = parse_mode(mode), torch.tensor([2, 0, 1, 5, 3, 4])
    assert not pairs_up(rows) and pairs_up(PARTNER)
    pos = torch.tensor([T - 3, T - 2]).repeat_interleave(B)
    hook = patch_rows_at(torch.randn(2 * B, T, model.cfg.d_model, dtype=torch.float64), pos, model)
    fw = Forwards(model)
    got = fw.final_logits(toks, mode, [(depth_name(1), hook)], edit_from=T - 3, rows=rows, replicas=2)
    close(got, final_logits(model, toks[rows].repeat(2, 1), mode, [(depth_name(1), hook)]))
    assert got.shape[0] == 2 * B and fw.builds == 1


@pytest.mark.parametrize("mode,serial", [("recurrent:1", True), ("jacobi:2", True), ("full", False)])
def test_every_start_of_one_prefix_equals_the_whole_run(model, toks, mode, serial):
    """One built prefix serves every edit_from <= T-1 under both hook rules, in any order."""
    mode = parse_mode(mode)
    fw = Forwards(model)
    for p in (T - 1, 2, T - 4, 0):
        hooks = [(depth_name(2), set_at(values(model, seed=p), p, model))]
        close(
            fw.final_logits(toks, mode, hooks, edit_from=p, serial=serial),
            final_logits(model, toks, mode, hooks, serial),
        )
    assert fw.builds == 1


def test_prefixes_live_with_their_batch_or_the_holding_block(model, toks):
    mode, other = parse_mode("recurrent:1"), tokens(B, T, vocab=64, seed=2)
    fw = Forwards(model)
    for t in (toks, toks, other, toks):  # outside holding only the batch being run keeps its prefixes
        fw.final_logits(t, mode, edit_from=T - 1)
    assert fw.builds == 3
    fw = Forwards(model)
    with fw.holding():
        with fw.holding():  # nested: prefixes live until the outermost block ends
            for t in (toks, other, toks, other):
                fw.final_logits(t, mode, edit_from=T - 1)
        fw.final_logits(toks, mode, edit_from=T - 1)
    assert fw.builds == 2
    fw.final_logits(toks, mode, edit_from=T - 1)
    assert fw.builds == 3  # the block's prefixes went with it


def test_a_batch_changed_in_place_gets_a_new_prefix(model):
    mode, t = parse_mode("recurrent:1"), tokens(B, T, vocab=64, seed=3)
    fw = Forwards(model)
    fw.final_logits(t, mode, edit_from=T - 1)
    t[:, 2] = (t[:, 2] + 1) % 64  # same tensor, new content
    close(fw.final_logits(t, mode, edit_from=T - 1), final_logits(model, t, mode))
    assert fw.builds == 2


@pytest.mark.parametrize("mode,builds", [("recurrent:1", 1), ("full", 2)])
def test_soft_and_std_answers_from_the_held_recurrent1_prefix(model, toks, mode, builds):
    """Soft decoding's prompt is the standard prefill of x_1..x_{T-1}: recurrent:1's prefix when the
    batch holds one (no second build), else one serial prefix of its own."""
    fw = Forwards(model)
    fw.final_logits(toks, parse_mode(mode), edit_from=T - 1)
    hooks = [("fusion.hook_gate", set_at(torch.zeros(model.cfg.d_model, dtype=torch.float64), T - 1, model))]
    close(fw.soft_answer_logits(toks, hooks), soft_answer_logits(model, toks, hooks))
    close(fw.soft_answer_logits(toks), soft_answer_logits(model, toks))
    close(fw.std_answer_logits(toks), model.prefill_cache(toks)[2][:, -1])
    assert fw.builds == builds


def test_an_earlier_start_does_not_leave_a_stale_soft_prompt(model, toks):
    """The Soft view shares the recurrent:1 prefix's caches; a run that starts earlier rewrites
    them (with its edits), so the next Soft answer must not read them."""
    fw, mode = Forwards(model), parse_mode("recurrent:1")
    fw.final_logits(toks, mode, edit_from=T - 1)
    fw.soft_answer_logits(toks)
    hooks = [(depth_name(1), set_at(values(model, seed=7), 2, model))]
    close(fw.final_logits(toks, mode, hooks, edit_from=2), final_logits(model, toks, mode, hooks))
    close(fw.soft_answer_logits(toks), soft_answer_logits(model, toks))


def test_no_reuse_runs_the_whole_sequence_and_builds_nothing(model, toks, monkeypatch):
    monkeypatch.setattr(F, "build_prefix", lambda *a, **k: pytest.fail("built a prefix"))
    fw, mode = Forwards(model, reuse=False), parse_mode("jacobi:2")
    hooks = [("fusion.hook_feedback", set_at(values(model, n=2 * B), T - 1, model))]  # a value per replica row
    close(
        fw.final_logits(toks, mode, hooks, edit_from=T - 1, rows=PARTNER, replicas=2),
        final_logits(model, toks[PARTNER].repeat(2, 1), mode, hooks),
    )
    close(fw.soft_answer_logits(toks), soft_answer_logits(model, toks))
    assert fw.builds == 0
