"""The synthetic probe tasks (docs/tasks.md): specs, minimal-pair generators, an independent label
checker, the word-level tokenizer, dataset files and training streams.

    from fbt_probe.tasks import load_spec, generate, load_dataset, build_tokenizer
    df = generate(load_spec("completion"), groups=80, seed=0)
"""

from fbt_probe.tasks.checker import interpret, run_program
from fbt_probe.tasks.dataset import SAMPLE_COLUMNS, load_dataset, write_dataset
from fbt_probe.tasks.generators import COLUMNS, generate
from fbt_probe.tasks.spec import BUILTIN, TaskSpec, list_specs, load_spec, spec_from_dict
from fbt_probe.tasks.streams import HeldOut, heldout_groups, training_documents
from fbt_probe.tasks.tokenizer import (
    build_tokenizer,
    check_tokenizer_fits,
    load_tokenizer,
    save_tokenizer,
    tokenizer_sha256,
)

__all__ = [
    "BUILTIN",
    "COLUMNS",
    "HeldOut",
    "SAMPLE_COLUMNS",
    "TaskSpec",
    "build_tokenizer",
    "check_tokenizer_fits",
    "generate",
    "heldout_groups",
    "interpret",
    "list_specs",
    "load_dataset",
    "load_spec",
    "load_tokenizer",
    "run_program",
    "save_tokenizer",
    "spec_from_dict",
    "tokenizer_sha256",
    "training_documents",
    "write_dataset",
]
