"""Sparse autoencoders on a hook of a latent-feedback model (first: the carried state), saved in
SAELens's on-disk format, and the feature-level tests on the carried state (docs/sae.md)."""

from fbt_probe.sae.model import ARCHITECTURES, SAEConfig, SparseAutoencoder, is_sae_folder
from fbt_probe.sae.train import SAETrainConfig, train_sae

__all__ = ["ARCHITECTURES", "SAEConfig", "SAETrainConfig", "SparseAutoencoder", "is_sae_folder", "train_sae"]
