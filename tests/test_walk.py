"""The executable schedule (`fbt_probe.engine.walk`): every consumer's walk against an independent
float64 reference, and the engine held to the primitives it declares.

The reference is written here from the definition of each mode (docs/modes.md), with the model's
three primitives only and no KV cache, step, schedule or walk: the serial recurrence as one whole
pass over positions 0..n-1 per fed position n (its top state at n - 1 is the state into n), a
Jacobi pass as a whole pass fed the previous pass's top states shifted one position right. float64:
the walk and the reference differ in summation order only (~1e-15); a state fed one position off,
a pass too few or an edit that misses a carried state moves the logits at order 1e-3 or more.
"""

import pytest
import torch

from fbt_probe.engine.hooks import hooked, silent
from fbt_probe.engine.prefix import build_prefix
from fbt_probe.engine.schedule import Schedule
from fbt_probe.engine.walk import Primitives, Walk, carried_states, passes
from fbt_probe.interventions.das import FinalStep
from fbt_probe.modes import parse_mode
from fbt_probe.training.evaluate import contraction_by_document
from fbt_probe.training.objective import feedback_loss
from tests.helpers import make_model, make_nanochat, tokens

pytestmark = pytest.mark.usefixtures("one_thread")
T = 9
MODES = ["standard", "recurrent:1", "recurrent:3", "full", "jacobi:1", "jacobi:2", "jacobi:4", "jacobi:30"]
TOL = dict(rtol=0, atol=1e-10)
EDIT = ("blocks.1.hook_resid_pre", lambda x, hook: x * 1.1 + 0.01)  # position-wise: the same edit in every pass


def whole(model, toks, states, has, hk):
    """One pass over toks with `states` fed where `has`: (top states, logits)."""
    x = model.embed_fuse(toks, states, has, hk)
    state, _, logits = model.top(model.trunk(x, 0, None, hk, toks), hk)
    return state, logits


def reference(model, toks, mode: str, hk=silent):
    """The logits of `mode` on toks (see the module doc), hooks calling `hk` in every pass."""
    mode = parse_mode(mode)
    B, n = toks.shape
    if mode.parallel and mode.k < n:
        return jacobi(model, toks, mode.k, hk)[-1][1]
    first = mode.first_fed_position(n)  # jacobi:K >= T is the recurrence too
    states, has = torch.zeros(B, n, model.cfg.d_model, dtype=torch.float64), torch.arange(n) >= first
    for t in range(first, n):
        states[:, t] = whole(model, toks[:, :t], states[:, :t], has[:t], hk)[0][:, t - 1]
    return whole(model, toks, states, has, hk)[1]


def jacobi(model, toks, K: int, hk=silent) -> list:
    """(top states, logits) of each of K Jacobi passes."""
    out, states, has = [], None, torch.arange(toks.shape[1]) >= 1
    for _ in range(K):
        out.append(whole(model, toks, states, None if states is None else has, hk))
        states = torch.cat([torch.zeros_like(out[-1][0][:, :1]), out[-1][0][:, :-1]], dim=1)
    return out


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def toks():
    return tokens(2, T)


@pytest.mark.parametrize("mode", MODES)
@torch.no_grad()
def test_every_rule_of_the_forward_equals_the_reference(model, toks, mode):
    want = reference(model, toks, mode)
    for serial in (None, True, False):
        torch.testing.assert_close(model(toks, mode=mode, serial=serial), want, **TOL)
    with model.hooks(fwd_hooks=[EDIT]):  # the edit reaches every carried state: the reference with it in every pass
        edited = reference(model, toks, mode, hooked)
    for serial in (None, True):  # the exact and the serial rule
        got = model.run_with_hooks(toks, mode=mode, serial=serial, fwd_hooks=[EDIT])
        torch.testing.assert_close(got, edited, **TOL)
    if parse_mode(mode).first_fed_position(T) < T:
        assert (edited - want).abs().max() > 1e-3 and (edited[:, 1:] - want[:, 1:]).abs().amax(-1).min() > 1e-4


@pytest.mark.parametrize("mode", MODES)
@torch.no_grad()
def test_prefix_reuse_and_das_equal_the_reference(model, toks, mode):
    want = reference(model, toks, mode)
    for serial in (False, True):
        for upto in (0, 4, T - 1):
            pre = build_prefix(model, toks, parse_mode(mode), upto, serial)
            for start in (upto, upto // 2):
                torch.testing.assert_close(pre.run(start), want[:, start:], **TOL)
    torch.testing.assert_close(FinalStep.build(model, toks, parse_mode(mode))(), want[:, -1], **TOL)


def test_training_and_contraction_walk_the_jacobi_passes(model, toks):
    """Training's per-pass losses (eq. 12, with gradients) and the contraction table's per-pass
    losses and state changes are those of the reference's K passes."""
    targets = tokens(2, T, seed=5)
    weights = torch.rand(2, T, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    ce = lambda lg, w: (  # noqa: E731
        -(torch.log_softmax(lg, -1).gather(-1, targets[..., None])[..., 0] * w).sum() / w.sum()
    )
    total, parts = feedback_loss(model, toks, targets, weights, 3, 0.5)
    with torch.no_grad():
        ref = jacobi(model, toks, 3)
        for got, (_, logits) in zip(parts, ref):
            torch.testing.assert_close(got, ce(logits, weights), **TOL)
        table, by_doc = contraction_by_document(model, toks, targets, weights, n_passes=3)
    real = (weights > 0).double()
    torch.testing.assert_close(
        torch.tensor(table["val_loss"].to_numpy()), torch.stack([ce(lg, real) for _, lg in ref]), **TOL
    )
    change = [(b - a).norm(dim=-1) for (a, _), (b, _) in zip(ref, ref[1:])]  # [batch, T] per pass
    assert table["state_change"].isna().tolist() == [True, False, False]
    torch.testing.assert_close(
        torch.tensor(table["state_change"].to_numpy()[1:]), torch.stack([c.mean() for c in change]), **TOL
    )
    torch.testing.assert_close(torch.tensor(by_doc[1:]), torch.stack([c.mean(-1) for c in change]), **TOL)
    total.backward()  # the gradient flows through every pass into the fusion
    assert model.fusion.W_U.weight.grad.abs().max() > 0
    model.zero_grad(set_to_none=True)


class Declared:
    """A model that exposes only what `Primitives` declares: reading, setting or calling anything
    else raises, so an engine path that reaches past the declared primitives fails."""

    NAMES = set(Primitives.__annotations__) | {n for n in vars(Primitives) if not n.startswith("_")}

    def __init__(self, model):
        object.__setattr__(self, "_model", model)

    def __getattr__(self, name):
        if name not in Declared.NAMES:
            raise AttributeError(f"the engine used '{name}', which engine.walk.Primitives does not declare")
        return getattr(self._model, name)

    def __setattr__(self, name, value):
        if name not in Declared.NAMES:
            raise AttributeError(f"the engine set '{name}', which engine.walk.Primitives does not declare")
        setattr(self._model, name, value)


@pytest.mark.parametrize("make", [make_model, make_nanochat], ids=["base", "nanochat"])
@torch.no_grad()
def test_the_engine_calls_only_the_declared_primitives(make, toks):
    """Every walk the engine runs (each rule's chunks, carried states, prefix reuse, the Jacobi
    iteration, the lean step and scan) on a model that exposes nothing but `Primitives`."""
    model = make()
    m = Declared(model)
    assert {"embed_fuse", "trunk", "top", "hook_context"} <= Declared.NAMES
    with pytest.raises(AttributeError, match="does not declare"):
        m.forward(toks)
    for mode in ("recurrent:2", "full", "jacobi:3", "jacobi:30"):
        mode = parse_mode(mode)
        sched = Schedule(mode, T)
        has = sched.has_state(toks.device)
        states, _, _ = carried_states(m, toks, mode)
        for rule, chunks in (("serial", sched.serial()), ("exact", sched.exact())):
            got = Walk(m, toks, has=has).run(chunks).logits
            torch.testing.assert_close(got, model(toks, mode=mode, serial=rule == "serial"), **TOL)
        got = Walk(m, toks, has=has, states=states).run([sched.final()]).logits
        torch.testing.assert_close(got, model(toks, mode=mode), **TOL)
        for serial in (False, True):
            seen = []
            got = build_prefix(m, toks, mode, 5, serial).run(3, fwd_hooks=[(EDIT[0], lambda x, hook: seen.append(x))])
            torch.testing.assert_close(got, model(toks, mode=mode, serial=serial)[:, 3:], **TOL)
            assert seen and all(x.shape[1] <= T - 3 for x in seen)  # the hooks fired, from position 3 on
    logits = model.jacobi_passes(toks, 3)
    walked = []
    passes(m, toks, 3, each=lambda chunk, state, lg, prev: walked.append(lg))
    for a, b in zip(walked, logits):
        torch.testing.assert_close(a, b, **TOL)


def test_the_full_schedule_trains_pass_one_and_the_recurrence(toks):
    """Training's `full` schedule: L_1 + lam * L_full, L_full on the reference recurrence fed only
    where a per-row `has` says (the prefix mixin's plain prompt prefix), values and gradients; the
    serial scan equals the last of T Jacobi passes fed at the same positions."""
    model = make_model(feedback_noise=0.0).train()  # no noise: the scan and the reference draw none
    has = torch.arange(T)[None, :] >= torch.tensor([[1], [5]])  # row 1 keeps positions 0..4 plain
    targets = tokens(2, T, seed=5)
    weights = torch.rand(2, T, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    ce = lambda lg: -(torch.log_softmax(lg, -1).gather(-1, targets[..., None])[..., 0] * weights).sum() / weights.sum()  # noqa: E731

    def recurrence(fed):  # the states built out of place: the gradient flows through each
        states = torch.zeros(2, 1, model.cfg.d_model, dtype=torch.float64)
        for t in range(1, T):
            top = whole(model, toks[:, :t], states, fed[:, :t], silent)[0][:, t - 1]
            states = torch.cat([states, top[:, None]], dim=1)
        return whole(model, toks, states, fed, silent)[1]

    total, parts = feedback_loss(model, toks, targets, weights, "full", 0.5, has)
    got = [p.grad for p in (total.backward(), model.parameters())[1]]
    model.zero_grad(set_to_none=True)
    full = recurrence(has)
    one, want = ce(whole(model, toks, None, None, silent)[1]), ce(full)
    torch.testing.assert_close(torch.stack(parts).detach(), torch.stack([one, want]).detach(), **TOL)
    (one + 0.5 * want).backward()
    for a, (name, p) in zip(got, model.named_parameters()):
        torch.testing.assert_close(a, p.grad, **TOL, msg=name)
    assert model.fusion.W_U.weight.grad.abs().max() > 0  # the gradient reaches the fusion through the scan
    with torch.no_grad():  # the per-row plain prefix matters (a scan that fed it would be caught)...
        assert (recurrence(has) - recurrence(torch.arange(T)[None, :].expand(2, T) >= 1))[1].abs().max() > 1e-3
        # ...and the scan is the last of T Jacobi passes fed at the same positions
        torch.testing.assert_close(
            model.recurrence_logits(toks, has), model.jacobi_passes(toks, T, has_state=has)[-1], **TOL
        )
    model.zero_grad(set_to_none=True)
