"""`jacobi:K` with K >= T (the input's length) is the exact recurrence (`jacobi:T` = `full`): it runs
through the serial scan of `full`, not T passes over T positions, and gives the Jacobi passes' answer."""

import pytest
import torch

from tests.helpers import make_model, tokens


def jacobi_by_passes(model, toks, K):
    """The definition: min(K, T) parallel passes, each fed the right-shifted top states of the last."""
    return model.jacobi_passes(toks, min(K, toks.shape[1]))[-1]


@pytest.mark.parametrize("K", [5, 12, 13, 99999])
def test_jacobi_past_the_length_equals_its_passes_in_float64(K):
    model = make_model(seed=3)
    for T in (2, 5, 12):  # a mix of lengths: K >= T for some, K < T for others
        toks = tokens(2, T, seed=T)
        with torch.no_grad():
            got = model(toks, mode=f"jacobi:{K}")
            torch.testing.assert_close(got, jacobi_by_passes(model, toks, K), rtol=1e-10, atol=1e-10)
            if K >= T:
                torch.testing.assert_close(got, model(toks, mode="full"), rtol=1e-10, atol=1e-10)


def test_jacobi_past_the_length_runs_one_parallel_pass(monkeypatch):
    model = make_model(seed=1)
    toks = tokens(1, 40)
    calls = []
    real = model.trunk

    def trunk(x, start, cache, *args, **kwargs):  # a parallel pass over the whole sequence: no KV cache
        calls.extend([1] if cache is None else [])
        return real(x, start, cache, *args, **kwargs)

    monkeypatch.setattr(model, "trunk", trunk)
    with torch.no_grad():
        model(toks, mode="jacobi:99999")
    assert len(calls) == 1  # the hooked final pass; before: 40 passes
    calls.clear()
    with torch.no_grad():
        model(toks, mode="jacobi:3")
    assert len(calls) == 3
