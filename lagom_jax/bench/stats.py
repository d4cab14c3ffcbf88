"""The median of an arm's step times, its 95% interval, and whether two arms differ beyond noise.

The interval is distribution-free: the order statistics that bracket the median with at
least 95% coverage under the binomial law of "a sample falls below the median" (the sign
test's interval; no assumption on the distribution of step times, no random resampling, so a
rerun on the same numbers gives the same answer).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

__all__ = ["MIN_SAMPLES", "Summary", "faster", "summarize", "verdict"]

# The fewest samples whose extreme order statistics bracket the median with 95%: 1 - 2 / 2**6.
MIN_SAMPLES = 6


@dataclasses.dataclass(frozen=True)
class Summary:
    """An arm's timed steps: count, median and the 95% interval of the median (ms)."""

    n: int
    median_ms: float
    low_ms: float
    high_ms: float

    @property
    def bracketed(self) -> bool:
        """Whether the interval holds the median with 95% (6 samples or more)."""
        return self.n >= MIN_SAMPLES


def _binom_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def summarize(times_ms: Sequence[float], confidence: float = 0.95) -> Summary:
    """Median and interval of ``times_ms``. Fewer than 6 samples cannot bracket the median at
    95%: the interval is then the whole range, and says so by being wide."""
    xs = sorted(float(t) for t in times_ms)
    n = len(xs)
    if n == 0:
        raise ValueError("no step times to summarize")
    median = statistics.median(xs)
    # The largest j with P(Binomial(n, 1/2) <= j - 1) <= (1 - confidence) / 2: [x_j, x_{n+1-j}].
    alpha, j = (1 - confidence) / 2, 0
    while j + 1 <= n // 2 and _binom_cdf(j, n) <= alpha:
        j += 1
    if j == 0:
        return Summary(n, median, xs[0], xs[-1])
    return Summary(n, median, xs[j - 1], xs[n - j])


def faster(arm: Summary, base: Summary) -> bool:
    """Whether ``arm`` is faster than ``base`` beyond the noise: both bracketed, intervals apart."""
    return arm.bracketed and base.bracketed and arm.high_ms < base.low_ms


def verdict(arm: Summary, base: Summary, arm_name: str, base_name: str) -> str:
    """One sentence: whether ``arm`` differs from ``base`` beyond the noise of either."""
    ratio = base.median_ms / arm.median_ms if arm.median_ms > 0 else float("inf")
    if not (arm.bracketed and base.bracketed):
        return (f"{arm_name} against {base_name}: {ratio:.3f}x, but with fewer than {MIN_SAMPLES} timed steps an arm "
                "has no 95% interval, so noise cannot be told apart (more --steps or --rounds)")
    if arm.high_ms < base.low_ms:
        return (f"{arm_name} is faster than {base_name}: {ratio:.3f}x, beyond the noise (their 95% intervals "
                "do not overlap)")
    if arm.low_ms > base.high_ms:
        return (f"{arm_name} is slower than {base_name}: {ratio:.3f}x, beyond the noise (their 95% intervals "
                "do not overlap)")
    return f"{arm_name} and {base_name} do not differ beyond the noise ({ratio:.3f}x, 95% intervals overlap)"
