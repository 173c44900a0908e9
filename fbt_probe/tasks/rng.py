"""A random stream that stays the same across Python versions, so datasets stay byte-identical."""

from __future__ import annotations

import hashlib
import random


class StableRng:
    """Seeded from a key via SHA-256 and driven only by `getrandbits`, whose stream Python keeps
    fixed across versions (unlike `randrange`/`shuffle`)."""

    def __init__(self, *key):
        digest = hashlib.sha256(repr(key).encode()).digest()
        self._r = random.Random(int.from_bytes(digest[:16], "big"))

    def below(self, n: int) -> int:
        """Uniform integer in [0, n)."""
        k = max(n - 1, 1).bit_length()
        while (x := self._r.getrandbits(k)) >= n:
            pass
        return x

    def uniform(self) -> float:
        return self._r.random()

    def choice(self, seq):
        return seq[self.below(len(seq))]

    def bits(self, k: int) -> int:
        return self._r.getrandbits(k) if k > 0 else 0

    def shuffle(self, items: list) -> list:
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]
        return items
