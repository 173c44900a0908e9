"""How the `TrainConfig` fields appear on `fbt-probe train`'s command line: the options generated
from the dataclass (`cli.fromconfig`), what differs from a field, and the fields' text forms."""

from __future__ import annotations

from fbt_probe.cli.fromconfig import INTS, ConfigOptions, Flag, Text
from fbt_probe.errors import FbtError
from fbt_probe.tasks import load_spec
from fbt_probe.training import TrainConfig


def parse_tasks(text: str) -> tuple[str, ...]:
    """'registers,registers-count' -> the task names (each a built-in task or a spec file)."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names or len(set(names)) < len(names):
        raise FbtError(f"--tasks '{text}': expected distinct comma-separated tasks (e.g. registers,registers-count)")
    for name in names:
        try:
            load_spec(name)
        except FbtError as exc:
            raise FbtError(f"--tasks '{text}': {exc}") from None
    return names


def parse_task_shares(text: str) -> dict:
    """'completion:.5,memory:.25,registers:.25' -> {task: share} (checked by TrainConfig)."""
    return {name.strip(): float(share) for name, _, share in (item.partition(":") for item in text.split(","))}


SHARES = "'task:share,...' summing to 1 (e.g. completion:.5,memory:.25,registers:.25)"
RAMP = Text(lambda t: None if t.strip().lower() == "none" else t, "'M:N ...' or 'none'", "<'M:N ...'|none>", str)
# options a recipe sets: not given, the recipe's value applies, else the config's
UNSET = ("steps", "tokens_per_step", "lr", "warmup", "min_lr_ratio", "decay_steps", "answer_share", "one_pass_steps")
OPTIONS = ConfigOptions(
    {"": TrainConfig},
    flags={
        **{name: Flag(unset=True) for name in (*UNSET, "register_queries", "copy_steps", "register_steps")},
        "tasks": Flag(text=Text(parse_tasks, "comma-separated tasks", "<task,...>", ",".join), unset=True),
        "task_shares": Flag(text=Text(parse_task_shares, SHARES, "<task:share,...>")),
        "schedule": Flag(default="paper"),  # the record keeps the name
        "register_ramp": Flag(text=RAMP),
        "streams": Flag(unset="2 under --arch hidden-decoding"),
        "cross_stream_layers": Flag(("--cross-layers",), text=INTS),
    },
    exclude=dict.fromkeys(
        ("knobs", "betas", "weight_decay", "clip", "prefix_mix", "answer_weight", "heldout_fraction"),
        "set in a config, not on the command line",
    )
    | dict.fromkeys(("eval_every", "save_every", "init_sha256", "corpus_sha256"), "set by the training loop")
    | {"init": "--init is the path the weights start from; run_training records it"}
    | dict.fromkeys(("fork", "fork_sha256"), "--fork is the run this one continues; run_training records it"),
)


def hidden_options(arch: str, given: dict) -> dict:
    """The Hidden Decoding fields of `arch` (none for feedback, which refuses them)."""
    streams, layers = given.get("streams"), given.get("cross_stream_layers")
    if arch == "feedback":
        if streams is not None or layers is not None:
            raise FbtError("--streams and --cross-layers need --arch hidden-decoding")
        return {}
    if arch != "hidden-decoding":
        raise FbtError(f"--arch '{arch}': expected 'feedback' or 'hidden-decoding'")
    if streams is not None and streams < 1:
        raise FbtError(f"--streams {streams}: expected an integer >= 1")
    return {"arch": arch, "streams": 2 if streams is None else streams, "cross_stream_layers": layers}
