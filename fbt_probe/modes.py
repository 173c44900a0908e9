"""Prefill modes, parsed in one place (docs/modes.md).

| mode          | carried states                                                                   |
|---------------|----------------------------------------------------------------------------------|
| standard      | none: every input is a plain embedding                                           |
| recurrent:k   | standard prefill of x_1..x_{T-k}, then the last k tokens one at a time, each fused |
|               | with the previous position's top state of this same run                          |
| full          | every position t >= 2 fused with h_{t-1} of the same serial run (= recurrent:T-1) |
| jacobi:K      | pass 1 standard; pass k fuses the right-shifted top states of pass k-1 everywhere |
"""

from __future__ import annotations

import re

from fbt_probe.errors import FbtError

_PATTERN = re.compile(r"^(standard|full|recurrent:(\d+)|jacobi:(\d+))$")
MODE_HELP = "standard | recurrent:k (k >= 1) | full | jacobi:K (K >= 1)"


class Mode(str):
    """A parsed prefill mode. It is its canonical name ("recurrent:1"; `str` subclass), so tables,
    manifests, dict keys and comparisons with names read it as that string, and it carries what
    the name means: `kind` ("standard" | "recurrent" | "full" | "jacobi") and `k` (recurrent: the
    number of serial steps; jacobi: the number of passes). Parsed once, at the edge
    (`parse_mode`, `parse_modes`); everything after takes a Mode."""

    kind: str
    k: int

    def __new__(cls, kind: str, k: int = 0) -> "Mode":
        self = super().__new__(cls, kind if kind in ("standard", "full") else f"{kind}:{k}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "k", k)
        return self

    def __setattr__(self, name, value):
        raise AttributeError("Mode is immutable")

    def __reduce__(self):
        return (Mode, (self.kind, self.k))

    @property
    def scans(self) -> bool:
        """recurrent:k, full: its serial computation is a standard prefix, then one step per position."""
        return self.kind in ("recurrent", "full")

    @property
    def parallel(self) -> bool:
        """jacobi:K: its serial computation is parallel passes over the whole sequence."""
        return self.kind == "jacobi"

    def n_serial(self, T: int) -> int:
        """How many trailing positions are computed one at a time (recurrent/full)."""
        if self.kind == "full":
            return T - 1
        return self.k if self.kind == "recurrent" else 0

    def passes(self, T: int) -> int:
        """Jacobi passes actually run on T positions: min(K, T). Pass k makes the first k positions
        exact, so every pass after the T-th repeats the T-th bit for bit (`jacobi:T` = `full`)."""
        return min(self.k, T) if self.kind == "jacobi" else 1

    def exact_passes(self, T: int) -> int:
        """Parallel passes after which the mode's carried states are exact when each pass feeds the
        previous one's top states (the exact hook rule): pass k fixes the k-th fed position, so
        recurrent:k needs k + 1, full T, and jacobi:K is its own min(K, T) passes."""
        if self.kind == "jacobi":
            return self.passes(T)
        return min(self.n_serial(T) + 1, T)

    def check_length(self, T: int) -> None:
        if self.kind == "recurrent" and self.k >= T:
            raise FbtError(f"mode '{self}': k must be < the sequence length {T} (recurrent:{T - 1} is 'full')")

    def first_fed_position(self, T: int) -> int:
        """The first (0-based) position that receives a carried state; T if none."""
        if self.kind == "standard" or (self.kind == "jacobi" and self.k == 1):
            return T
        if self.kind == "jacobi":
            return 1
        return T - self.n_serial(T)


def parse_mode(mode: "str | Mode") -> Mode:
    if isinstance(mode, Mode):
        return mode
    m = _PATTERN.match(str(mode).strip())
    if not m:
        raise FbtError(f"mode '{mode}': expected {MODE_HELP}")
    if m.group(2) is not None:
        k = int(m.group(2))
        if k < 1:
            raise FbtError(f"mode '{mode}': recurrent:k needs k >= 1")
        return Mode("recurrent", k)
    if m.group(3) is not None:
        k = int(m.group(3))
        if k < 1:
            raise FbtError(f"mode '{mode}': jacobi:K needs K >= 1")
        return Mode("jacobi", k)
    return Mode(m.group(1))


def require_mode(mode) -> Mode:
    """`mode` itself when it is a parsed Mode; a TypeError naming the parser when it is not (the
    functions behind the entry points take parsed modes only)."""
    if not isinstance(mode, Mode):
        raise TypeError(f"expected a Mode (fbt_probe.modes.parse_mode), got {mode!r}")
    return mode


def parse_modes(spec: "str | list", also: tuple[str, ...] = ()) -> list[Mode]:
    """A comma-separated list (or a list), e.g. 'standard,recurrent:1,full'; each mode at most once.
    Names in `also` (a caller's own targets, e.g. extraction's reference) pass through as strings."""
    items = spec.split(",") if isinstance(spec, str) else [str(s) for s in spec]
    modes = [s.strip() if s.strip() in also else parse_mode(s) for s in items if s.strip()]
    if not modes:
        raise FbtError(f"modes '{spec}': expected a comma-separated list of {MODE_HELP}")
    check_distinct([str(m) for m in modes], spec)
    return modes


def check_distinct(names: list[str], spec) -> None:
    """Refuse a mode named twice (after normalisation: 'recurrent:01' is 'recurrent:1')."""
    seen = set()
    for name in names:
        if name in seen:
            raise FbtError(
                f"modes '{spec if isinstance(spec, str) else ','.join(map(str, spec))}': "
                f"'{name}' is listed twice; expected each mode at most once"
            )
        seen.add(name)
