"""Batched path: every (depth, label set, fold) cell of a condition fitted at once with batched L-BFGS.

Each cell solves scikit-learn's problem on its own training rows: features standardized with the
training rows' mean and (population) std, constant features scaled by 1, then
`min_w,b  mean_train(softplus(z) - y z) + ‖w‖² / (2 C n_train)`, `z = x_std · w + b` (intercept not
penalized; the same minimizer as `LogisticRegression(C)`, whose lbfgs also uses this mean-normalized
objective and stops on max |gradient| <= tol).

The standardization is folded into the weights (`z = x · (w / σ) + (b − μ · w / σ)`), so the data
stays one raw tensor X [P, N, D] shared by every fold: one batched matmul per function evaluation
(`[P, N, D] @ [P, D, S·F]`) and one for the gradient. Runs on CPU (tests) and CUDA.
"""

from __future__ import annotations

import numpy as np
import torch

from fbt_probe.probes.splits import Split


class _Problem:
    """Loss and gradient of all P x S x F cells; parameters theta [B, D + 1], B = P·S·F.

    Logits are kept in float64 and moved along a search direction as `z + t · zd`, so a line search
    costs no matmul and compares losses at float64 precision even when X is float32.
    """

    def __init__(self, X: torch.Tensor, Y: torch.Tensor, train: torch.Tensor, C: float):
        self.X, self.Y = X, Y[None, :, None, :]  # [P, N, D], [1, S, 1, N]
        P, N, D = X.shape
        S, F = Y.shape[0], train.shape[0]
        self.shape, self.D = (P, S, F), D
        mask = train.to(torch.float64)  # [F, N]
        n_train = mask.sum(1)  # [F]
        mu = torch.zeros(P, F, D, dtype=torch.float64, device=X.device)
        var = torch.zeros_like(mu)
        for p in range(P):  # float64 statistics, one depth at a time to bound memory
            Xp = X[p].to(torch.float64)
            mu[p] = (mask @ Xp) / n_train[:, None]
            var[p] = (mask @ (Xp * Xp)) / n_train[:, None] - mu[p] ** 2
        sd = var.clamp_min(0).sqrt()
        const = sd <= 1e-7 * mu.abs().clamp_min(1.0)
        self.mu, self.sd = mu[:, None], torch.where(const, torch.ones_like(sd), sd)[:, None]  # [P, 1, F, D]
        self.wmask = (mask / n_train[:, None])[None, None]  # [1, 1, F, N] weights of the training mean
        self.reg = (1.0 / (C * n_train))[None, None, :]  # [1, 1, F]

    def split(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        th = theta.view(*self.shape, self.D + 1)
        return th[..., : self.D], th[..., self.D]

    def logits(self, theta: torch.Tensor) -> torch.Tensor:
        """[P, S, F, N] logits of every cell on every row (linear in theta)."""
        P, S, F = self.shape
        w, b = self.split(theta)
        v = w / self.sd  # [P, S, F, D] raw-space weights
        c = b - (v * self.mu).sum(-1)  # [P, S, F]
        z = torch.bmm(self.X, v.reshape(P, S * F, self.D).transpose(1, 2).to(self.X.dtype))  # [P, N, S·F]
        return z.to(torch.float64).transpose(1, 2).reshape(P, S, F, -1) + c[..., None]

    def loss(self, z: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        w, _ = self.split(theta)
        data = ((torch.nn.functional.softplus(z) - self.Y * z) * self.wmask).sum(-1)
        return (data + 0.5 * self.reg * (w * w).sum(-1)).reshape(-1)

    def grad(self, z: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        P, S, F = self.shape
        w, _ = self.split(theta)
        r = (torch.sigmoid(z) - self.Y) * self.wmask  # [P, S, F, N] d loss / d z
        gv = torch.bmm(self.X.transpose(1, 2), r.reshape(P, S * F, -1).transpose(1, 2).to(self.X.dtype))
        gv = gv.to(torch.float64).transpose(1, 2).reshape(P, S, F, self.D)  # X^T r
        rsum = r.sum(-1)  # [P, S, F]
        gw = (gv - self.mu * rsum[..., None]) / self.sd + self.reg[..., None] * w
        return torch.cat([gw, rsum[..., None]], -1).reshape(P * S * F, self.D + 1)


def _lbfgs(problem: _Problem, max_iter: int, tol: float, history: int = 10):
    """Batched L-BFGS with per-cell Armijo backtracking. Returns theta [B, D + 1], iterations [B] and
    a converged flag [B] (max |gradient| <= tol)."""
    B = int(np.prod(problem.shape))
    n_params = problem.D + 1
    dev = problem.X.device
    theta = torch.zeros(B, n_params, dtype=torch.float64, device=dev)
    z = problem.logits(theta)
    f, g = problem.loss(z, theta), problem.grad(z, theta)
    S_h = torch.zeros(history, B, n_params, dtype=torch.float64, device=dev)
    Y_h, rho = torch.zeros_like(S_h), torch.zeros(history, B, dtype=torch.float64, device=dev)
    gamma = 1.0 / g.norm(dim=1).clamp_min(1.0)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    n_iter = torch.zeros(B, dtype=torch.long, device=dev)
    stored = 0
    for _ in range(max_iter):
        active &= g.abs().amax(1) > tol
        if not bool(active.any()):
            break
        q = g.clone()  # two-loop recursion, newest pair first; slots with rho = 0 are no-ops
        alphas = []
        for j in range(min(stored, history)):
            k = (stored - 1 - j) % history
            a = rho[k] * (S_h[k] * q).sum(1)
            q -= a[:, None] * Y_h[k]
            alphas.append((k, a))
        q *= gamma[:, None]
        for k, a in reversed(alphas):
            q += (a - rho[k] * (Y_h[k] * q).sum(1))[:, None] * S_h[k]
        d = torch.where(active[:, None], -q, torch.zeros_like(q))
        gd = (g * d).sum(1)
        bad = active & (gd >= 0)  # not a descent direction: fall back to scaled steepest descent
        d = torch.where(bad[:, None], -g * gamma[:, None], d)
        gd = (g * d).sum(1)
        zd = problem.logits(d)  # logits are linear in theta: the change along d
        t = active.to(torch.float64)
        pending = active.clone()
        shape_t = (*problem.shape, 1)
        for _ in range(60):
            ok = pending & (problem.loss(z + t.view(shape_t) * zd, theta + t[:, None] * d) <= f + 1e-4 * t * gd)
            pending &= ~ok
            if not bool(pending.any()):
                break
            t = torch.where(pending, t * 0.5, t)
        t = torch.where(pending, torch.zeros_like(t), t)
        active &= ~pending  # no decrease even for tiny steps: at the precision floor, stop
        s = t[:, None] * d
        theta = theta + s
        z = z + t.view(shape_t) * zd
        f_new, g_new = problem.loss(z, theta), problem.grad(z, theta)
        y = g_new - g
        sy = (s * y).sum(1)
        yy = (y * y).sum(1)
        valid = active & (sy > 1e-12 * yy.clamp_min(1e-300))
        k = stored % history
        S_h[k], Y_h[k] = s, y
        rho[k] = torch.where(valid, 1.0 / sy.clamp_min(1e-300), torch.zeros_like(sy))
        gamma = torch.where(valid, sy / yy.clamp_min(1e-300), gamma)
        stored += 1
        n_iter += active.long()
        f, g = f_new, g_new
    return theta, n_iter, g.abs().amax(1) <= tol


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def fit_cells_torch(
    X,
    labels,
    splits: list[Split],
    *,
    C: float = 1.0,
    max_iter: int = 1000,
    tol: float = 1e-4,
    device: str | None = None,
    dtype: torch.dtype = torch.float32,
    return_params: bool = False,
) -> dict[str, np.ndarray]:
    """Same cells and outputs as `fit_cells_sklearn` (arrays [P, S, F]; `correct` [P, S, N]), fitted in one batch.

    X [P, N, D] is held on `device` in `dtype` (float32 halves memory; statistics, losses and the
    optimizer state are float64). With `return_params`, also the standardized-space weights
    `weights` [P, S, F, D], `bias` [P, S, F] and scaler `mean` / `scale` [P, F, D].
    """
    dev = torch.device(device or default_device())
    Xt = torch.as_tensor(np.asarray(X), device=dev).to(dtype)
    labels = np.atleast_2d(np.asarray(labels))
    classes = np.unique(labels)
    if classes.size != 2:
        raise ValueError(f"the batched path fits binary probes; got labels {classes.tolist()}")
    Y = torch.as_tensor(labels == classes[1], dtype=torch.float64, device=dev)  # [S, N]
    N = Xt.shape[1]
    train = torch.zeros(len(splits), N, dtype=torch.bool, device=dev)
    test = torch.zeros_like(train)
    for f, (tr, te) in enumerate(splits):
        train[f, torch.as_tensor(tr, device=dev)] = True
        test[f, torch.as_tensor(te, device=dev)] = True
    problem = _Problem(Xt, Y, train, C)
    theta, n_iter, converged = _lbfgs(problem, max_iter, tol)
    with torch.no_grad():
        pred = problem.logits(theta) > 0  # [P, S, F, N]
        hit = (pred == Y.bool()[None, :, None, :]).to(torch.float64)
        acc = (hit * test[None, None]).sum(-1) / test.sum(1)
        tr_acc = (hit * train[None, None]).sum(-1) / train.sum(1)
        # each sample's held-out hit from the one fold that tests it (folds partition the tested rows)
        tested = test.any(0)
        correct = (hit * test[None, None]).sum(2).masked_fill(~tested, float("nan"))  # [P, S, N]
    shape = problem.shape
    out = {
        "accuracy": acc.cpu().numpy(),
        "train_accuracy": tr_acc.cpu().numpy(),
        "n_iter": n_iter.view(shape).cpu().numpy(),
        "converged": converged.view(shape).cpu().numpy(),
        "correct": correct.cpu().numpy(),
    }
    if return_params:
        th = theta.view(*shape, -1).cpu().numpy()
        out.update(
            weights=th[..., :-1],
            bias=th[..., -1],
            mean=problem.mu[:, 0].cpu().numpy(),
            scale=problem.sd[:, 0].cpu().numpy(),
        )
    return out
