"""A curriculum on the length knob k (`TrainConfig.k_curriculum`, parsed in `config.py`): training
draws only the cells of k up to the current stage's, and the stage advances when the held-out answer
accuracy at its k reaches a threshold (or, in the fixed form, at given steps: another run's
advancements replayed).

The data stay a pure function of the run: a step's batches are those of (config, step, the k it
draws), and the steps at which the stages advanced are saved in the run's train state
(`train_state.pt`, field `curriculum`), so a resumed run draws what the uninterrupted one drew."""

from __future__ import annotations

import warnings

from fbt_probe.errors import FbtError
from fbt_probe.training.config import KCurriculum, TrainConfig, parse_k_curriculum
from fbt_probe.training.evaluate import answer_accuracy, eval_samples

CURRICULUM_WORDS = 256  # the most words (groups) of a k the measure reads
MIN_HELDOUT = 64  # a k with fewer held-out words is read on its trained words (see `Progress.samples`)


def k_at(cur: KCurriculum, advanced, step: int) -> int:
    """The largest k drawn at `step` (0-based), given the steps at which the stages advanced."""
    at = cur.starts[1:] if cur.starts is not None else tuple(advanced)
    return cur.ks[sum(1 for s in at if s <= step)]


def eval_mode(cfg: TrainConfig) -> str:
    """The mode the curriculum measures in: the deepest iteration the schedule trains (`jacobi:K`,
    the exact recurrence `full` where K >= T or under the `full` schedule), `standard` for a
    one-pass model."""
    return "standard" if cfg.baseline or cfg.arch != "feedback" else cfg.pass_mix.deepest_mode


def measure_accuracy(model, samples, tokenizer, mode: str) -> float:
    """The lowest answer accuracy over the tasks of `samples` (one k) under `mode`."""
    return float(answer_accuracy(model, samples, tokenizer, modes=(mode,))["accuracy"].min())


class Progress:
    """A run's position in its curriculum: `advanced` (the steps at which the stages advanced, as the
    train state records them), the k a step draws, and the measure that advances a stage."""

    def __init__(self, cfg: TrainConfig, tokenizer, advanced=()):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.cur = parse_k_curriculum(cfg.k_curriculum)
        self.advanced = list(advanced) if self.cur.threshold is not None else []
        self._samples: dict = {}

    def k(self, step: int) -> int:
        return k_at(self.cur, self.advanced, step)

    def samples(self, k: int):
        """(samples, words, held out) the measure at k reads: one pair per word, the held-out words of
        k (at most CURRICULUM_WORDS); a k with fewer than MIN_HELDOUT held-out words (k <= 8 of the
        chain tasks, whose 2^k words a fifth of are held out) is read on the words the run trains on
        instead: a handful of held-out words (none at k = 2 for some seeds) would advance on one or
        two, and one never-seen word among four (k = 2) would hold the stage back for good, a model
        having no way to learn a word it never saw from three others."""
        if k not in self._samples:
            from fbt_probe.training.data import heldout

            knobs = {t: [k] for t in self.cfg.tasks}
            held = heldout(self.cfg)
            df, is_held = None, True
            try:
                df = self._draw(knobs, held)
            except FbtError:  # no held-out word at this k
                pass
            if df is None or _fewest_words(df) < MIN_HELDOUT:
                df, is_held = self._draw(knobs, Trained(held)), False
            self._samples[k] = (df, _fewest_words(df), is_held)
        return self._samples[k]

    def _draw(self, knobs, contexts):
        with warnings.catch_warnings():  # the cap at the words a k has is the rule, not news
            warnings.simplefilter("ignore", UserWarning)
            return eval_samples(self.cfg, self.tokenizer, pairs=CURRICULUM_WORDS, knobs=knobs, contexts=contexts)

    def update(self, model, step: int) -> dict | None:
        """After `step` steps (at the eval cadence): the measure at the current k, and the advance to the
        next k where it reaches the threshold. Returns the log record's `curriculum` entry (None in
        the fixed form, which measures nothing)."""
        if self.cur.threshold is None:
            return None
        k = self.k(step - 1)
        df, words, is_held = self.samples(k)
        acc = measure_accuracy(model, df, self.tokenizer, eval_mode(self.cfg))
        rec = {"k": k, "accuracy": acc, "groups": words, "heldout": is_held, "advanced_to": None}
        if acc >= self.cur.threshold and k != self.cur.ks[-1]:
            self.advanced.append(step)
            rec["advanced_to"] = self.k(step)
        return rec


class Trained:
    """The contexts a run trains on: those its held-out split does not hold out."""

    def __init__(self, held):
        self.held = held

    def __contains__(self, context_id) -> bool:
        return context_id not in self.held


def _fewest_words(df) -> int:
    return int(df.groupby("task")["group_id"].nunique().min())
