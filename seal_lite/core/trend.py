"""Is a run's reward rising? A trend test with the steps as units (Mann-Kendall, by permutation).

A step's trajectories share its policy and its tasks, so counting them as independent samples overstates the
evidence; here each step contributes one number, its mean reward. The statistic is Mann-Kendall's
S = Σ_{i<j} sign(r_j − r_i) (ties count 0), reported as Kendall's τ = S / (n(n−1)/2). Under the null hypothesis
(no trend: every order of the steps' rewards is equally likely) the one-sided p-value is the share of orderings
whose S is at least the observed one: every ordering for up to 8 steps, else a seeded random sample of them.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

EXACT_UP_TO = 8  # 8! = 40,320 orderings
RESAMPLES = 20_000


@dataclass(frozen=True)
class Trend:
    steps: int
    tau: float  # Kendall's τ between step index and reward: +1 a strict rise, −1 a strict fall
    p_rise: float  # one-sided: the chance of a τ this large or larger if the order of the steps were random

    def describe(self, level: float = 0.05) -> str:
        verdict = "a rise told apart from chance" if self.p_rise < level else "not told apart from chance"
        return f"τ {self.tau:+.2f} over {self.steps} steps, p = {self.p_rise:.2g} (steps as units): {verdict}"


def mann_kendall_s(values: list[float]) -> int:
    return sum((b > a) - (b < a) for a, b in itertools.combinations(values, 2))


def reward_trend(values: list[float], seed: int = 0) -> Trend | None:
    """The trend of per-step rewards, or None with fewer than 4 steps (no ordering test can say anything)."""
    n = len(values)
    if n < 4:
        return None
    observed = mann_kendall_s(values)
    tau = observed / math.comb(n, 2)
    if n <= EXACT_UP_TO:
        orderings = list(itertools.permutations(values))
        return Trend(n, tau, sum(mann_kendall_s(list(order)) >= observed for order in orderings) / len(orderings))
    rng = random.Random(seed)
    at_least = sum(mann_kendall_s(rng.sample(values, n)) >= observed for _ in range(RESAMPLES))
    return Trend(n, tau, (at_least + 1) / (RESAMPLES + 1))  # the observed order counts as one of the sample
