"""GRPO group advantages, SEAL diagnosis weights and closed-loop label utilities (docs/method.md §2, §5).

All functions here take plain lists/dicts and return plain values, so they are tested without models.
"""

from __future__ import annotations

import math
from collections import Counter

from seal_lite.core.labels import BASE_UTILITY, EXCLUDED_LABELS
from seal_lite.core.types import Label

STD_EPS = 1e-6
WEIGHT_MIN, WEIGHT_MAX = 0.5, 2.0


def group_advantages(rewards: list[float]) -> list[float]:
    """A_j = (r_j - mean(r)) / (std(r) + 1e-6) within one task's group (§2 step 7).

    std is the sample standard deviation (unbiased), as in TRL's GRPOTrainer; a group with equal rewards
    gets A = 0 for every member.
    """
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1)) if n > 1 else 0.0
    return [(r - mean) / (std + STD_EPS) for r in rewards]


def share_with_signal(groups: list[list[float]]) -> float:
    """The share of groups whose rewards are not all equal: the only groups whose advantages are not all 0."""
    return sum(len(set(rewards)) > 1 for rewards in groups) / len(groups)


def label_shares(labels: list[str]) -> dict[str, float]:
    """p_j(z): the share of a trajectory's turns labelled z, after dropping checker_error and gt_error."""
    counted = [label for label in labels if label not in EXCLUDED_LABELS]
    if not counted:
        return {}
    return {label: count / len(counted) for label, count in Counter(counted).items()}


def diagnosis_weight(labels: list[str], utilities: dict[str, float]) -> float:
    """w_j = clip(sum_z p_j(z) * rho(z), 0.5, 2.0); a trajectory without countable labels gets 1 (§2 step 8)."""
    shares = label_shares(labels)
    if not shares:
        return 1.0
    raw = sum(share * utilities[label] for label, share in shares.items())
    return min(WEIGHT_MAX, max(WEIGHT_MIN, raw))


def weighted_advantages(advantages: list[float], weights: list[float], apply_to: str = "all") -> list[float]:
    """Ã_j = w_j * A_j. ``apply_to`` limits the weighting to positive or negative advantages.

    w_j > 0, so a sign never flips and a zero advantage stays zero.
    """
    if apply_to not in ("all", "positive", "negative"):
        raise ValueError(f"apply_to must be all, positive or negative, not {apply_to!r}")
    out = []
    for a, w in zip(advantages, weights, strict=True):
        applies = apply_to == "all" or (apply_to == "positive" and a > 0) or (apply_to == "negative" and a < 0)
        out.append(a * w if applies else a)
    return out


def initial_utilities(overrides: dict[str, float] | None = None) -> dict[str, float]:
    """The base utility b_z of every countable label: §3's table, with the recipe's ``grpo.utilities`` on top.
    rho starts here, and the closed-loop target scales these same bases."""
    bases = {label: utility for label, utility in BASE_UTILITY.items() if utility is not None}
    return bases | (overrides or {})


def update_utilities(
    utilities: dict[str, float],
    label_counts: dict[str, int],
    label_mean_reward: dict[str, float],
    bases: dict[str, float] | None = None,
    alpha: float = 1.0,
    momentum: float = 0.75,
) -> dict[str, float]:
    """One closed-loop update of rho from this epoch's window statistics (§5), around ``bases`` (b_z; default
    §3's table).

    target_z = clip(b_z * (1 + alpha * (count_z/N) * (1 - meanreward_z) * min(1, count_z/32)), 0.5, 2.0)
    rho_z <- momentum * rho_z + (1 - momentum) * target_z; ``pass`` keeps its base utility.
    """
    total = sum(count for label, count in label_counts.items() if label not in EXCLUDED_LABELS)
    updated = dict(utilities)
    for label, base in (bases or initial_utilities()).items():
        if label == Label.PASS:
            updated[label] = base
            continue
        count = label_counts.get(label, 0)
        if total == 0 or count == 0:
            target = base
        else:
            pressure = (count / total) * (1.0 - label_mean_reward.get(label, 0.0)) * min(1.0, count / 32)
            target = min(WEIGHT_MAX, max(WEIGHT_MIN, base * (1.0 + alpha * pressure)))
        updated[label] = momentum * utilities[label] + (1.0 - momentum) * target
    return updated
