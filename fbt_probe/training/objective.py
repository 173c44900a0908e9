"""The training objective of each architecture on one batch (eq. 12 for latent feedback)."""

from __future__ import annotations

from fbt_probe.config import arch_of
from fbt_probe.hidden.config import ARCH as HIDDEN_ARCH
from fbt_probe.hidden.loss import hidden_loss
from fbt_probe.model.loss import weighted_ce
from fbt_probe.training.config import FULL_PASSES


def feedback_loss(model, tokens, targets, weights, K: int | str, lam: float = 1.0, has_state=None):
    """Eq. 12 on one batch; returns (total loss, [L_1..L_K]). K = `FULL_PASSES` (the `full`
    schedule): L_1 + lam * L_full, the exact recurrence's loss by its serial scan; returns
    (total, [L_1, L_full])."""
    if K == FULL_PASSES:
        one = model.jacobi_passes(tokens, 1, has_state=has_state)[0]
        losses = [weighted_ce(lg, targets, weights) for lg in (one, model.recurrence_logits(tokens, has_state))]
        return losses[0] + lam * losses[1], losses
    losses = [weighted_ce(lg, targets, weights) for lg in model.jacobi_passes(tokens, K, has_state=has_state)]
    total = losses[0] if K == 1 else losses[0] + lam / (K - 1) * sum(losses[1:])
    return total, losses


def one_pass_hidden_loss(model, tokens, targets, weights, K: int = 1, lam: float = 1.0, has_state=None):
    """A Hidden Decoding model's eq. 2: one pass, read at the last streams (K = 1)."""
    loss = hidden_loss(model, tokens, targets, weights)
    return loss, [loss]


# the model's architecture (`fbt_probe.config.arch_of`) -> its objective
LOSSES = {"feedback": feedback_loss, HIDDEN_ARCH: one_pass_hidden_loss}


def multipass_loss(model, tokens, targets, weights, K: int, lam: float = 1.0, has_state=None):
    """The training objective of `model`'s architecture on one batch; returns (total loss, [L_1..L_K])."""
    return LOSSES[arch_of(model)](model, tokens, targets, weights, K, lam, has_state)
