"""Training an SAE on a matrix of activations (deterministic for a seed on one machine).

Objective per batch, with x̂ = decode(encode(x)) and the data's total variance V = E‖x − E x‖²:

    L = E‖x − x̂‖² / V                                (the batch's fraction of variance unexplained)
      + topk:     aux_coeff · E‖e − ê_dead‖² / V      e = x − x̂ (detached); ê_dead the residual's
                                                     reconstruction by the k_aux largest latents that
                                                     have not fired for `dead_after` rows (AuxK,
                                                     Gao et al. 2024: revives dead latents)
      + jumprelu: l0_coeff · E ‖f‖₀                    through the straight-through estimator of the
                                                     threshold (Rajamanoharan et al. 2024: rectangle
                                                     kernel of width `bandwidth`)

Initialisation: decoder rows random unit vectors, W_enc = W_decᵀ, b_enc = 0, b_dec = the data mean;
after every Adam step the decoder rows are put back to unit norm. The learning rate decays linearly
to zero over the last fifth of the steps. Batches are drawn by a `torch.Generator` seeded with
`seed`, so a seed gives the same SAE byte for byte on one machine.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from fbt_probe.errors import FbtError
from fbt_probe.sae.model import ARCHITECTURES, SAEConfig, SparseAutoencoder


@dataclass(frozen=True)
class SAETrainConfig:
    architecture: str = "topk"
    expansion: int = 4  # d_sae = expansion x d_in
    k: int = 8  # topk: active latents per row
    steps: int = 3000
    batch_size: int = 256
    lr: float = 2e-3
    seed: int = 0
    aux_coeff: float = 1 / 32  # topk: weight of the AuxK loss
    dead_after: int = 20_000  # topk: rows without firing before a latent counts as dead
    l0_coeff: float = 2e-3  # jumprelu: weight of the L0 penalty
    bandwidth: float = 0.1  # jumprelu: kernel width of the straight-through estimator (x a coordinate's std)
    init_threshold: float = 0.1  # jumprelu: initial threshold (x a coordinate's std)

    def check(self) -> None:
        """Every option in range, named as the command line spells it (a NaN would train to NaN)."""
        if self.architecture not in ARCHITECTURES:
            raise FbtError(f"--architecture {self.architecture}: expected one of {', '.join(ARCHITECTURES)}")
        for name, value in (("k", self.k), ("steps", self.steps), ("batch-size", self.batch_size)):
            if value < 1:
                raise FbtError(f"--{name} {value}: expected an integer >= 1")
        if not 1 <= self.expansion <= MAX_EXPANSION:
            raise FbtError(f"--expansion {self.expansion}: expected an integer 1..{MAX_EXPANSION}")
        if not 0 <= self.seed < 2**63:
            raise FbtError(f"--seed {self.seed}: expected an integer 0..2**63-1")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise FbtError(f"--lr {self.lr}: expected a finite number > 0")
        for name, value in (
            ("l0-coeff", self.l0_coeff),
            ("aux-coeff", self.aux_coeff),
            ("bandwidth", self.bandwidth),
            ("init-threshold", self.init_threshold),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise FbtError(f"--{name} {value}: expected a finite number >= 0")


MAX_EXPANSION = 1024  # d_sae = expansion x d_in: wider dictionaries than this are a typo, not a study


def _kernel(u: torch.Tensor) -> torch.Tensor:
    return (u.abs() < 0.5).to(u.dtype)


class _JumpReLU(torch.autograd.Function):
    """z · 1[z > θ]; ∂/∂θ through the rectangle kernel: −(θ/ε) K((z − θ)/ε)."""

    @staticmethod
    def forward(ctx, z, theta, eps):
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return z * (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx, g):
        z, theta = ctx.saved_tensors
        eps = ctx.eps
        dz = g * (z > theta).to(z.dtype)
        dtheta = (-(theta / eps) * _kernel((z - theta) / eps) * g).sum(0)
        return dz, dtheta, None


class _Step(torch.autograd.Function):
    """1[z > θ] (the L0 count); ∂/∂θ = −(1/ε) K((z − θ)/ε), no gradient to z."""

    @staticmethod
    def forward(ctx, z, theta, eps):
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx, g):
        z, theta = ctx.saved_tensors
        eps = ctx.eps
        return torch.zeros_like(z), (-(1.0 / eps) * _kernel((z - theta) / eps) * g).sum(0), None


def init_sae(cfg: SAEConfig, data: torch.Tensor, gen: torch.Generator) -> SparseAutoencoder:
    sae = SparseAutoencoder(cfg)
    with torch.no_grad():
        W = torch.randn(cfg.d_sae, cfg.d_in, generator=gen, dtype=sae.W_dec.dtype)
        W /= W.norm(dim=1, keepdim=True)
        sae.W_dec.copy_(W)
        sae.W_enc.copy_(W.T)
        sae.b_dec.copy_(data.mean(0).to(sae.b_dec.dtype))
    return sae


def train_sae(data: torch.Tensor, cfg: SAETrainConfig, metadata: dict | None = None, log=None):
    """(SAE, training record) for activations `data` [rows, d_in]."""
    cfg.check()
    if data.ndim != 2 or data.shape[0] < 2:
        raise FbtError(f"SAE training: expected activations [rows >= 2, d_in], got {tuple(data.shape)}")
    data = data.float()
    n, d = data.shape
    scfg = SAEConfig(d, cfg.expansion * d, cfg.architecture, cfg.k, "float32", dict(metadata or {}))
    gen = torch.Generator().manual_seed(cfg.seed)
    sae = init_sae(scfg, data, gen)
    var = (data - data.mean(0)).pow(2).sum(1).mean().clamp_min(1e-12)
    scale = float((var / d).sqrt())  # a coordinate's spread: the unit of the threshold and the kernel width
    eps = cfg.bandwidth * scale
    log_theta = None
    params = [sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec]
    if cfg.architecture == "jumprelu":
        log_theta = torch.nn.Parameter(torch.full((scfg.d_sae,), math.log(cfg.init_threshold * scale)))
        params.append(log_theta)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    decay_from = int(cfg.steps * 0.8)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 if s < decay_from else max(0.0, (cfg.steps - s) / max(1, cfg.steps - decay_from))
    )
    since = torch.zeros(scfg.d_sae)  # rows since each latent last fired
    k_aux = min(scfg.d_sae // 2, 2 * cfg.k) if cfg.architecture == "topk" else 0
    t0, history = time.perf_counter(), []
    for step in range(cfg.steps):
        x = data[torch.randint(0, n, (cfg.batch_size,), generator=gen)]
        pre = sae.pre_acts(x)
        if cfg.architecture == "topk":
            f = sae.activate(pre)
            x_hat = sae.decode(f)
            mse = (x - x_hat).pow(2).sum(1).mean() / var
            fired = (f > 0).any(0)
            since = torch.where(fired, torch.zeros_like(since), since + cfg.batch_size)
            dead = since >= cfg.dead_after
            aux = torch.zeros(())
            if dead.any() and k_aux > 0:
                e = (x - x_hat).detach()
                masked = pre.masked_fill(~dead, float("-inf"))
                kk = min(k_aux, int(dead.sum()))
                vals, idx = masked.topk(kk, dim=-1)
                fa = torch.zeros_like(pre).scatter(-1, idx, vals.relu())
                aux = (e - fa @ sae.W_dec).pow(2).sum(1).mean() / var
            loss = mse + cfg.aux_coeff * aux
            l0 = float((f > 0).sum(1).float().mean())
        else:
            theta = log_theta.exp()
            f = _JumpReLU.apply(pre, theta, eps)
            x_hat = sae.decode(f)
            mse = (x - x_hat).pow(2).sum(1).mean() / var
            l0_t = _Step.apply(pre, theta, eps).sum(1).mean()
            loss = mse + cfg.l0_coeff * l0_t
            l0 = float(l0_t.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        with torch.no_grad():
            sae.W_dec /= sae.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)
        if step % max(1, cfg.steps // 20) == 0 or step == cfg.steps - 1:
            rec = {"step": step, "fvu_batch": round(float(mse.detach()), 6), "l0_batch": round(l0, 3)}
            history.append(rec)
            if log is not None:
                log(rec)
    if log_theta is not None:
        with torch.no_grad():
            sae.threshold.copy_(log_theta.detach().exp())
    if log is not None:
        seconds = time.perf_counter() - t0
        log(
            {"seconds": round(seconds, 2), "rows_per_second": round(cfg.steps * cfg.batch_size / max(seconds, 1e-9), 1)}
        )
    # the record goes into cfg.json: no wall-clock numbers, so a seed gives the same folder byte for byte
    return sae, {"train": asdict(cfg), "rows": n, "history": history}
