"""Training configuration and its pass mix, the distribution of feedback passes per batch that the
`schedule` field (`--schedule`) names (docs/training.md)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from fbt_probe.errors import FbtError
from fbt_probe.hidden.config import ARCH as HIDDEN_ARCH
from fbt_probe.tasks.spec import load_spec
from fbt_probe.training.mix import MAX_QUERIES, parse_register_mix

PAPER_SCHEDULE = "1:0.75,2:0.22,3:0.03"


@dataclass(frozen=True)
class PassMix:
    """The pass mix: K (number of feedback passes of a batch) -> probability (`parse_schedule` reads
    it from the `schedule` field), or `full`: every batch trains pass 1 and the exact recurrence
    (`FULL_PASSES`). Not `fbt_probe.engine.schedule.Schedule`, a mode's chunks."""

    probs: tuple[tuple[int | str, float], ...]

    @property
    def serial(self) -> bool:
        """The `full` schedule: pass 1 and the exact recurrence, by its serial scan."""
        return self.probs == ((FULL_PASSES, 1.0),)

    @property
    def max_passes(self) -> int:
        """The deepest Jacobi pass trained; for `full`, 2 (its two loss terms: the recurrence is
        trained at every depth, `deepest_mode`)."""
        return 2 if self.serial else max(k for k, _ in self.probs)

    @property
    def deepest_mode(self) -> str:
        """The mode of the deepest pass trained: `full`, `jacobi:K`, or `standard` for one pass."""
        return "full" if self.serial else "standard" if self.max_passes == 1 else f"jacobi:{self.max_passes}"

    def draw(self, u: float) -> int | str:
        """K for a uniform draw u in [0, 1) (`FULL_PASSES` for the `full` schedule)."""
        cum = np.cumsum([p for _, p in self.probs])
        return self.probs[min(int(np.searchsorted(cum, u, side="right")), len(self.probs) - 1)][0]

    def __str__(self) -> str:
        if self.serial:
            return FULL_PASSES
        if len(self.probs) == 1:
            return f"constant:{self.probs[0][0]}"
        return ",".join(f"{k}:{p:g}" for k, p in self.probs)


FULL_PASSES = "full"  # the schedule (and a step's drawn K) that trains L_1 + lam * L_full (`objective.feedback_loss`)
MAX_PASSES = 64  # K passes make a step K forwards long: the paper trains K <= 3


def _check_k(text: str, k: int) -> None:
    if k > MAX_PASSES:
        raise FbtError(
            f"schedule '{text}': K {k} passes: expected K <= {MAX_PASSES} (each pass is a forward of the whole "
            "sequence per training step; the paper trains K <= 3)"
        )


def parse_schedule(text: str) -> PassMix:
    """The pass mix a `schedule` field names: '1:.75,2:.22,3:.03' (K:probability, summing to 1),
    'constant:K', 'paper', or 'full' (pass 1 and the exact recurrence, every batch)."""
    text = text.strip()
    if text == "paper":
        text = PAPER_SCHEDULE
    if text == FULL_PASSES:
        return PassMix(((FULL_PASSES, 1.0),))
    if text.startswith("constant:"):
        k = text.split(":", 1)[1]
        if not k.isdigit() or int(k) < 1:
            raise FbtError(f"schedule '{text}': constant:K needs an integer K >= 1")
        _check_k(text, int(k))
        return PassMix(((int(k), 1.0),))
    probs = {}
    for item in text.split(","):
        try:
            k, p = item.split(":")
            k, p = int(k), float(p)
        except ValueError:
            raise FbtError(
                f"schedule '{text}': expected 'K:p,K:p,...' (e.g. {PAPER_SCHEDULE}), 'constant:K' or 'full'"
            ) from None
        if k < 1 or not (math.isfinite(p) and p >= 0) or k in probs:
            raise FbtError(f"schedule '{text}': each K must be a distinct integer >= 1 with a finite p >= 0")
        _check_k(text, k)
        probs[k] = p
    if abs(sum(probs.values()) - 1.0) > 1e-6:
        raise FbtError(f"schedule '{text}': probabilities sum to {sum(probs.values()):g}, expected 1")
    return PassMix(tuple(sorted(probs.items())))


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "tiny"
    """Model preset."""
    tasks: tuple[str, ...] = ("completion", "memory", "registers", "registers-count")  # = DEFAULT_TASKS
    """Tasks trained and evaluated, each a built-in task or a spec file."""
    knobs: dict | None = None  # task -> training knobs; None = TRAIN_KNOBS (else the spec grid)
    task_shares: dict | None = None
    """Share of each step's tokens per task, summing to 1, split equally over the task's (length) cells.

    None: DEFAULT_TASK_SHARES over the configured tasks, renormalised (resolved at construction, so
    config.json records the shares used). Half on completion: with equal cell shares completion was
    learned at every length on 1 seed of 3, with these shares on 5 of 6 (docs/research/completion-dependable.md)."""
    steps: int = 800
    """Optimizer steps."""
    tokens_per_step: int = 2048
    """Tokens of documents drawn per optimizer step (one document per row, whole)."""
    lr: float = 1e-3
    """Peak learning rate.

    2e-3 learned completion later or not at all (docs/research/qk-norm-gain-and-lr.md)."""
    min_lr_ratio: float = 0.1
    """Cosine decay to this share of `lr`; 1 keeps it constant after warm-up.

    At a constant lr accuracy oscillates (docs/research/reference-recipe.md)."""
    warmup: int = 100
    """Linear warm-up steps."""
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01  # on matrices only
    clip: float = 1.0
    schedule: str = PAPER_SCHEDULE
    """Passes per batch: 'K:p,...' summing to 1, 'constant:K', 'paper' (1:.75,2:.22,3:.03), or 'full':
    pass 1 and the exact recurrence on every batch, L_1 + lam * L_full (eq. 12 with its passes
    k >= 2 replaced by their fixed point, computed by the serial scan: the arithmetic of one pass, in T steps)."""
    lam: float = 1.0
    """λ of eq. 12 (weight of the passes k >= 2)."""
    noise: float = 0.02
    """σ of the uniform noise on carried states."""
    prefix_mix: float = 0.25  # share of rows whose random prompt prefix keeps plain embeddings
    answer_weight: float = (
        20.0  # with answer_share None: the answer weighs this many text tokens (at 5 the mix sat at chance 900 steps)
    )
    answer_share: float | None = 0.5
    """The answers' share of each document's loss weight, in (0, 1]; 1: loss on the answers only.

    The share holds whatever the document's length (None: `answer_weight` instead): a fixed weight makes the answer a smaller share of longer documents
    (12 % of a 144-token completion document at weight 20, and that cell learned last;
    docs/research/completion-dependable.md). A document with several answers (`register_queries`) splits the share equally among them."""
    baseline: bool = False
    """No-feedback baseline: same data and steps, 1 pass only, fusion unused."""
    one_pass_steps: int = 0
    """The first N steps train one pass only (K = 1), then K follows the schedule."""
    arch: str = "feedback"
    """'feedback' (latent feedback) or 'hidden-decoding' (n streams per token, one pass, eq. 2 loss; fbt_probe.hidden)."""
    streams: int = 1
    """hidden-decoding: streams per token n."""
    cross_stream_layers: tuple[int, ...] | None = None
    """hidden-decoding: the cross-stream layers (None: the base's global layers)."""
    heldout_fraction: float = 0.2  # contexts kept out of training (probe/eval time only)
    dtype: str = "float32"
    """float32 or bfloat16 (autocast on the training device)."""
    seed: int = 0
    """Seed of the initialisation, data and noise."""
    eval_every: int = 100
    save_every: int = 100
    # ---- fields a format fbt-probe/2 record lacks: written to config.json only when set (absent = the default)
    register_mix: str | None = None
    """Register documents in place of the register tasks' training cells: space-separated kinds
    m:wpr:K:S[:weight] (m registers, K writes each, S scratch lines, 0 = none) or m:N:S[:weight] (N
    assignments); weight: share of the documents; a trailing :vN gives values 0..N-1, answered by
    the number itself.

    Together they take the register tasks' token share (`fbt_probe.training.mix`; stored normalised to m:wpr:K:S:weight)."""
    register_queries: int = 1
    """Supervised queries at the end of each register-mix document."""
    init: str | None = None  # the run (or ref:<name>) the weights started from (`run_training` records it)
    init_sha256: str | None = None  # that checkpoint's sha256 (model.safetensors), when it has one
    copy_steps: int = 0
    """Induction warm-up: the first N of the steps train on copy documents only (random numbers
    repeated after a random gap; `fbt_probe.training.copy`), then the tasks.

    It grows the content-based lookup the register tasks need, which register documents alone never
    taught the `tiny` model (docs/research/register-binding.md). The steps count towards `steps`,
    and the lr schedule runs over all of them."""
    register_steps: int = 0
    """After the warm-up, the next N steps train the register tasks alone, then all the tasks.

    Every other task's cells are left out, the step filled to `tokens_per_step` all the same. Register binding forms in the first few hundred steps after the
    warm-up when nothing else competes, and not within 1,700 steps when completion and memory share
    them (docs/research/reference-recipe.md)."""
    register_ramp: str | None = None
    """A curriculum over the register count inside the register phase: 'M:N ...' (the first N
    register-phase steps draw only register-mix kinds with at most M registers, then the next window,
    then every kind); 'none' for no ramp.

    E.g. '2:300 4:200'. Needs `register_mix` and must fit
    in `register_steps`."""
    corpus: str | None = None
    """A corpus folder (`fbt-probe corpus build`): train by next-token prediction on windows of its
    stored tokens, in its tokenizer, instead of on the tasks (`tasks` is then empty).

    Every window is `seq_len` tokens at a random offset of the training split, a function of (seed,
    step); validation reads the held-out files (docs/training.md, "A general language model")."""
    corpus_sha256: str | None = None  # the corpus's identity (its record's hashes), set when the run starts
    seq_len: int = 256
    """Corpus runs: tokens per training window (a row of a step)."""
    fork: str | None = None  # the run whose step-N checkpoint this run started from (`run_training(fork=...)`)
    fork_sha256: str | None = None  # that checkpoint's sha256 (model.safetensors)
    decay_steps: int = 0
    """The cosine decay to `min_lr_ratio` runs over the last N steps, the lr constant before them; 0:
    over every step after the warm-up.

    A warm-up-stable-decay schedule. Until the decay starts, the lr (and so the run) is that of the same config
    with a constant lr; in the reference recipe 300 decay steps removed the misses a constant lr left
    (docs/research/reference-recipe.md)."""
    k_curriculum: str | None = None
    """A curriculum on the length knob k: '2,4,8,16,24@0.9' draws at first only the cells of k = 2,
    and every `eval_every` steps (100) measures the held-out answer accuracy at the current k, adding the
    next k (cells up to it drawn) once it reaches 0.9; 'k:step,...' (e.g. 2:0,4:1200,8:3000) adds
    each k at the step given: another run's advancements replayed, on the same tokens.

    The measure reads one pair per word, the current k's held-out words (at most 256); a k with
    fewer than 64 held-out words reads the words the run trains on instead. It runs in the deepest
    mode the schedule trains (jacobi:K, = full for K >= T; standard for one pass), the lowest
    accuracy over the tasks counting. Each k must be a training length of every task, the last the
    longest (in the fixed form any: a replayed run may have stopped short of it). Every measure and
    advance is logged in metrics.jsonl (`curriculum`), the advances saved in the train state, so a
    resumed run continues bit for bit (docs/training.md)."""

    def __post_init__(self) -> None:
        mix = self.pass_mix  # validates
        if self.arch not in ARCH_NAMES:
            raise FbtError(f"train config: field 'arch' must be one of {ARCH_NAMES}, got {self.arch!r}")
        if self.arch == "feedback" and self.streams != 1:
            raise FbtError("train config: field 'streams' applies to arch 'hidden-decoding' only")
        if self.cross_stream_layers is not None:
            object.__setattr__(self, "cross_stream_layers", tuple(self.cross_stream_layers))
        if (self.baseline or self.arch in ONE_PASS_ARCHS) and str(mix) != "constant:1":
            object.__setattr__(self, "schedule", "constant:1")  # no feedback passes to draw
        if self.dtype not in ("float32", "bfloat16"):
            raise FbtError(f"train config: field 'dtype' must be float32 or bfloat16, got {self.dtype!r}")
        for name in ("steps", "tokens_per_step"):
            if getattr(self, name) < 1:
                raise FbtError(f"train config: field '{name}' must be >= 1")
        if self.corpus is None:
            self._check_tasks()
            if self.k_curriculum is not None:
                knobs = {t: (self.knobs or TRAIN_KNOBS)[t] for t in self.tasks}
                object.__setattr__(self, "k_curriculum", check_k_curriculum(self.k_curriculum, knobs, self.steps))
        else:
            self._check_corpus()
        if self.answer_share is not None and not 0 < self.answer_share <= 1:
            raise FbtError(
                f"train config: field 'answer_share' (--answer-share) must be in (0, 1] (1: answers only), got {self.answer_share}"
            )
        if not 0 <= self.min_lr_ratio <= 1:
            raise FbtError(
                f"train config: field 'min_lr_ratio' (--min-lr-ratio) must be in [0, 1] (1: constant lr), got {self.min_lr_ratio}"
            )
        if not (math.isfinite(self.lr) and self.lr >= 0) or self.warmup < 0:
            raise FbtError(
                f"train config: fields 'lr' and 'warmup' (--lr, --warmup) must be finite and >= 0, got {self.lr} and {self.warmup}"
            )
        self._check_floats()
        self._check_register_mix()
        d = self.decay_steps
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= self.steps:
            raise FbtError(
                f"train config: field 'decay_steps' (--decay-steps) must be an integer 0..steps ({self.steps}), got {d!r}"
            )
        o = self.one_pass_steps
        if isinstance(o, bool) or not isinstance(o, int) or not 0 <= o <= self.steps:
            raise FbtError(
                f"train config: field 'one_pass_steps' (--one-pass-steps) must be an integer 0..steps ({self.steps}), "
                f"got {o!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise FbtError(f"train config: field 'seed' (--seed) must be an integer 0..2**63-1, got {self.seed!r}")
        c = self.copy_steps
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= self.steps:
            raise FbtError(
                f"train config: field 'copy_steps' (--copy-steps) must be an integer 0..steps ({self.steps}), got {c!r}"
            )
        r = self.register_steps
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= self.steps - c:
            raise FbtError(
                f"train config: field 'register_steps' (--register-steps) must be an integer 0..steps - copy_steps "
                f"({self.steps - c}), got {r!r}"
            )
        if r and not self._has_register_task():
            raise FbtError(
                f"train config: field 'register_steps' (--register-steps) trains the register tasks alone: "
                f"tasks {list(self.tasks)} have none"
            )
        self._check_register_ramp()

    def _check_tasks(self) -> None:
        """The tasks trained: their lengths (knobs) and token shares, resolved and checked."""
        if self.knobs is None and any(t not in TRAIN_KNOBS for t in self.tasks):
            # a task without training lengths of its own (the serial-depth task) trains on its spec's grid
            knobs = {t: list(TRAIN_KNOBS.get(t) or load_spec(t).length_grid) for t in self.tasks}
            object.__setattr__(self, "knobs", knobs)
        if self.task_shares is None:
            default = {t: DEFAULT_TASK_SHARES.get(t, 0.0) for t in self.tasks}
            if not any(default.values()):  # no task with a default share (e.g. the serial-depth task alone): equal
                default = {t: 1.0 for t in self.tasks}
            total = sum(default.values())
            if total <= 0:
                raise FbtError(f"train config: no default task shares for {list(self.tasks)}; set field 'task_shares'")
            object.__setattr__(self, "task_shares", {t: v / total for t, v in default.items()})
        else:
            object.__setattr__(self, "task_shares", dict(self.task_shares))
        shares = self.task_shares
        if sorted(shares) != sorted(self.tasks) or any(
            not _number(v) or not math.isfinite(v) or v <= 0 for v in shares.values()
        ):
            raise FbtError(
                f"train config: field 'task_shares' needs a positive share for each of {list(self.tasks)}, got {shares}"
            )
        if abs(sum(shares.values()) - 1.0) > 1e-6:
            raise FbtError(f"train config: field 'task_shares' sums to {sum(shares.values()):g}, expected 1")

    def _check_corpus(self) -> None:
        """A corpus run: no tasks (the corpus is the data), the task-only fields at their defaults."""
        if not isinstance(self.corpus, str) or not self.corpus:
            raise FbtError(f"train config: field 'corpus' (--corpus) must be a corpus folder, got {self.corpus!r}")
        if tuple(self.tasks) not in ((), DEFAULT_TASKS):
            raise FbtError("train config: field 'corpus' (--corpus) trains on the corpus alone; leave --tasks out")
        if self.arch != "feedback":
            raise FbtError("train config: field 'corpus' (--corpus) trains arch 'feedback' (and --baseline) only")
        for name in TASK_ONLY:
            if getattr(self, name) != ADDED_FIELDS.get(name, None):
                raise FbtError(f"train config: field '{name}' applies to task training, not to a --corpus run")
        object.__setattr__(self, "tasks", ())
        object.__setattr__(self, "knobs", None)
        object.__setattr__(self, "task_shares", {})
        q = self.seq_len
        if isinstance(q, bool) or not isinstance(q, int) or not 2 <= q <= self.tokens_per_step:
            raise FbtError(
                f"train config: field 'seq_len' (--seq-len) must be an integer 2..tokens_per_step "
                f"({self.tokens_per_step}), got {q!r}"
            )

    def _check_floats(self) -> None:
        """Every float field finite and in its range (NaN passes no comparison, so each is explicit)."""
        ranges = {
            "lam": (0, None, "--lam"),
            "noise": (0, None, "--noise"),
            "weight_decay": (0, None, ""),
            "clip": (0, None, ""),
            "answer_weight": (0, None, ""),
            "prefix_mix": (0, 1, ""),
            "heldout_fraction": (0, 1, ""),
        }
        for name, (low, high, option) in ranges.items():
            v = getattr(self, name)
            if not (_number(v) and math.isfinite(v) and v >= low and (high is None or v <= high)):
                within = f"in [{low}, {high}]" if high is not None else f">= {low}"
                opt = f" ({option})" if option else ""
                raise FbtError(f"train config: field '{name}'{opt} must be a finite number {within}, got {v!r}")
        if len(self.betas) != 2 or not all(_number(b) and 0 <= b < 1 for b in self.betas):
            raise FbtError(f"train config: field 'betas' must be two numbers in [0, 1), got {self.betas!r}")

    def _check_register_ramp(self) -> None:
        if self.register_ramp is None:
            return
        where = f"train config: field 'register_ramp' (--register-ramp) {self.register_ramp!r}"
        if self.register_mix is None:
            raise FbtError(f"{where}: ramps the register mix's kinds: set field 'register_mix' (--register-mix) too")
        windows = parse_ramp(self.register_ramp, where)
        total = sum(n for _, n in windows)
        if total > self.register_steps:
            raise FbtError(
                f"{where}: its windows take {total} steps, more than the register phase "
                f"(register_steps = {self.register_steps}); pass a shorter ramp, or 'none'"
            )
        least = min(k.registers for k in self.register_kinds)
        for bound, _ in windows:
            if bound < least:
                raise FbtError(
                    f"{where}: no kind of the register mix has at most {bound} registers (the fewest is {least})"
                )
        object.__setattr__(self, "register_ramp", " ".join(f"{m}:{n}" for m, n in windows))

    @property
    def decay_start(self) -> int:
        """The step the lr's cosine starts at: the warm-up's end, or `steps - decay_steps` when later."""
        return max(self.warmup, self.steps - self.decay_steps) if self.decay_steps else self.warmup

    def ramp_bound(self, step: int) -> int | None:
        """The most registers a register-mix document may have at training step `step` (None: any)."""
        if self.register_ramp is None:
            return None
        at = step - self.copy_steps
        for bound, n in parse_ramp(self.register_ramp, "register_ramp"):
            if 0 <= at < n:
                return bound
            at -= n
        return None

    def _check_register_mix(self) -> None:
        q = self.register_queries
        if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= MAX_QUERIES:
            raise FbtError(
                f"train config: field 'register_queries' (--register-queries) must be an integer 1..{MAX_QUERIES}, got {q!r}"
            )
        if self.register_mix is None:
            if q != 1:
                raise FbtError(
                    "train config: field 'register_queries' (--register-queries) applies to register-mix documents: "
                    "set field 'register_mix' (--register-mix) too"
                )
            return
        object.__setattr__(self, "register_mix", " ".join(map(str, parse_register_mix(self.register_mix))))
        if not self._has_register_task():
            raise FbtError(
                f"train config: field 'register_mix' (--register-mix) replaces the register tasks' cells: "
                f"tasks {list(self.tasks)} have none (e.g. --tasks registers,registers-count)"
            )

    def _has_register_task(self) -> bool:
        return any(load_spec(t).kind == "registers" for t in self.tasks)

    @property
    def pass_mix(self) -> PassMix:
        return parse_schedule(self.schedule)

    @property
    def register_kinds(self):
        return () if self.register_mix is None else parse_register_mix(self.register_mix)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["tasks"], d["betas"] = list(self.tasks), list(self.betas)
        for name, default in ADDED_FIELDS.items():  # a run that does not use them records what it did before
            if d[name] == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str = "train config", legacy: bool = False) -> "TrainConfig":
        """The config a run recorded; every field must be present but those of `ADDED_FIELDS` (absent:
        not used). `legacy` (a run of checkpoint format
        fbt-probe/1) fills in only the fields added since, with the rule the run was trained with:
        `answer_share` None (the answer weighs `answer_weight` tokens), `task_shares` equal per
        (task, length) cell, `one_pass_steps` 0."""
        if not isinstance(d, dict):
            raise FbtError(f"{source}: expected an object of train config fields")
        d = dict(d)
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise FbtError(f"{source}: unknown field(s) {unknown} (written by another version of fbt-probe?)")
        if legacy:
            d.setdefault("answer_share", None)
            d.setdefault("one_pass_steps", 0)
            if "task_shares" not in d and isinstance(d.get("tasks"), list):
                d["task_shares"] = equal_cell_shares(d["tasks"], d.get("knobs"))
        for name, default in ADDED_FIELDS.items():
            d.setdefault(name, default)
        missing = [name for name in known if name not in d]
        if missing:
            raise FbtError(f"{source}: train config field '{missing[0]}' missing (a run records every field)")
        try:
            d["tasks"], d["betas"] = tuple(d["tasks"]), tuple(d["betas"])
            return cls(**d)
        except (TypeError, ValueError) as exc:
            raise FbtError(f"{source}: {exc}") from None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def equal_cell_shares(tasks, knobs: dict | None = None) -> dict:
    """Task shares that give every (task, length) cell the same share of the tokens (the rule
    before `task_shares` existed): a task's share is its number of lengths over all cells."""
    knobs = knobs or TRAIN_KNOBS
    n = {t: len(knobs[t]) for t in tasks}
    return {t: n[t] / sum(n.values()) for t in tasks}


# fields a format fbt-probe/2 record lacks, with the value that means "not used": config.json leaves
# them out at that value and a run that lacks them used none of them
ADDED_FIELDS = {
    "register_mix": None,
    "register_queries": 1,
    "init": None,
    "init_sha256": None,
    "copy_steps": 0,
    "register_steps": 0,
    "register_ramp": None,
    "decay_steps": 0,
    "corpus": None,
    "corpus_sha256": None,
    "seq_len": 256,
    "fork": None,
    "fork_sha256": None,
    "k_curriculum": None,
}
# fields of task training that a corpus run leaves at their "not used" value
TASK_ONLY = ("register_mix", "copy_steps", "register_steps", "register_ramp", "k_curriculum")
DEFAULT_TASKS = ("completion", "memory", "registers", "registers-count")


def parse_ramp(text, where: str) -> list[tuple[int, int]]:
    """'2:300 4:200' -> [(2, 300), (4, 200)]: (most registers, steps) windows, in order."""
    items = text.replace(",", " ").split() if isinstance(text, str) else []
    out = []
    for item in items:
        try:
            m, n = (int(x) for x in item.split(":"))
        except ValueError:
            raise FbtError(f"{where}: window {item!r}: expected M:N (at most M registers for N steps)") from None
        if m < 1 or n < 1:
            raise FbtError(f"{where}: window {item!r}: M and N must be >= 1")
        out.append((m, n))
    if not out:
        raise FbtError(f"{where}: expected one or more windows M:N (at most M registers for N steps)")
    return out


# ---- the k curriculum's text form (`TrainConfig.k_curriculum`; the run's progress: training/curriculum.py)
KC_WHERE = "train config: field 'k_curriculum' (--k-curriculum)"


@dataclass(frozen=True)
class KCurriculum:
    """The stages' k, ascending, and either the accuracy `threshold` that advances a stage or the
    fixed `starts` (the step each k is first drawn at; the first is 0)."""

    ks: tuple[int, ...]
    threshold: float | None = None
    starts: tuple[int, ...] | None = None

    def __str__(self) -> str:
        if self.starts is not None:
            return ",".join(f"{k}:{s}" for k, s in zip(self.ks, self.starts))
        return ",".join(map(str, self.ks)) + f"@{self.threshold:g}"


def parse_k_curriculum(text) -> KCurriculum:
    """'2,4,8,16,24@0.9' (advance when the held-out accuracy at the current k reaches 0.9) or
    '2:0,4:1200,8:3000' (k drawn from the step given: a run's advancements replayed)."""
    if not isinstance(text, str) or not text.strip():
        raise FbtError(f"{KC_WHERE}: expected 'k,k,...@accuracy' (e.g. 2,4,8,16,24@0.9) or 'k:step,...', got {text!r}")
    text = text.strip()
    if "@" in text:
        ks_text, _, thr_text = text.partition("@")
        ks = _ints(ks_text.split(","), text)
        try:
            threshold = float(thr_text)
        except ValueError:
            threshold = math.nan
        if not (math.isfinite(threshold) and 0 < threshold <= 1):
            raise FbtError(f"{KC_WHERE} '{text}': the accuracy after '@' must be a number in (0, 1], got {thr_text!r}")
        cur = KCurriculum(ks, threshold=threshold)
    else:
        items = [item.split(":") for item in text.split(",")]
        if any(len(item) != 2 for item in items):
            raise FbtError(
                f"{KC_WHERE} '{text}': expected 'k,k,...@accuracy' (e.g. 2,4,8,16,24@0.9) or 'k:step,...' "
                "(e.g. 2:0,4:1200,8:3000)"
            )
        ks, starts = _ints([k for k, _ in items], text), _ints([s for _, s in items], text, what="step", low=0)
        if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
            raise FbtError(f"{KC_WHERE} '{text}': the steps must start at 0 and increase, got {list(starts)}")
        cur = KCurriculum(ks, starts=starts)
    if any(b <= a for a, b in zip(cur.ks, cur.ks[1:])):
        raise FbtError(f"{KC_WHERE} '{text}': the k must increase, got {list(cur.ks)}")
    return cur


def _ints(items, text: str, what: str = "k", low: int = 1) -> tuple[int, ...]:
    out = []
    for item in items:
        item = item.strip()
        if not item.isdigit() or int(item) < low:
            raise FbtError(f"{KC_WHERE} '{text}': each {what} must be an integer >= {low}, got {item!r}")
        out.append(int(item))
    return tuple(out)


def check_k_curriculum(text, knobs: dict, steps: int) -> str:
    """The curriculum of a task run, checked against its tasks' lengths: every k a length of every
    task, the last the longest (the curriculum ends on the whole grid), fixed steps below `steps`.
    Returns its normal form."""
    cur = parse_k_curriculum(text)
    for task, lengths in knobs.items():
        missing = [k for k in cur.ks if k not in lengths]
        if missing:
            raise FbtError(f"{KC_WHERE} '{text}': k {missing[0]} is not a training length of {task} ({list(lengths)})")
    top = max(max(lengths) for lengths in knobs.values())
    if cur.starts is None and cur.ks[-1] != top:
        raise FbtError(f"{KC_WHERE} '{text}': the last k must be the longest training length ({top}), got {cur.ks[-1]}")
    if cur.starts is not None and cur.starts[-1] >= steps:
        raise FbtError(f"{KC_WHERE} '{text}': step {cur.starts[-1]} is past the run's last step ({steps - 1})")
    return str(cur)


ARCH_NAMES = ("feedback", HIDDEN_ARCH)  # each has its row in fbt_probe.training.arch.ARCHS
ONE_PASS_ARCHS = (HIDDEN_ARCH,)  # no feedback passes: the schedule is always constant:1
DEFAULT_TASK_SHARES = {"completion": 0.5, "memory": 0.25, "registers": 0.25, "registers-count": 0.25}
# The training lengths: the short end of each task's grid (probe sets go past them with --long).
TRAIN_KNOBS = {"completion": [0, 8, 32], "memory": [0, 8, 32], "registers": [2, 4, 8], "registers-count": [1, 2, 4, 8]}
