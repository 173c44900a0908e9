"""The nanochat family: checkpoints of the public nanochat latent-feedback reproduction.

    checkpoint.py  their folder (model_<step>.pt + meta_<step>.json) -> our model, and back
    config.py      NanochatConfig: the backbone's ModelConfig plus the family's extras (`arch: nanochat`)
    model.py       NanochatTransformer: the FeedbackTransformer with those extras

The core model (`fbt_probe.model`) is the paper's backbone only; everything nanochat computes
beyond it lives here, as subclasses of the core's pieces.
"""
