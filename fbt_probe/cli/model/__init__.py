"""`fbt-probe model info|import-hf|import-nanochat|export-hf|refs|pack`: one module per sub-command,
listed lazily by `fbt_probe.cli.COMMANDS` (so `model refs` does not import torch)."""
