"""The reference model: the paper's latent-feedback transformer on the Qwen3 backbone, every line
its math (components.py: norms, RoPE, attention, MLP, block; fusion.py; transformer.py: the
modes). What runs it fast is `fbt_probe.engine`; its TransformerLens surface is `fbt_probe.surface`."""
