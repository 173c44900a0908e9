"""fbt_probe.formats: models on disk, one module per format (docs/checkpoints.md).

    checkpoint.py   this package's own (config.json + model.safetensors + tokenizer.json)
    qwen3.py        Hugging Face Qwen3 folders, both ways (feedback off: the same logits)
    nanochat.py     the public FBT reproduction's nanochat checkpoints (model_<step>.pt + meta_<step>.json)

They build models of `fbt_probe.model` and read or write their weights; nothing in the model
imports them.
"""
