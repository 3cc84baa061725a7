"""`sweep.search` with `method: random`: the sampled points of a random search.

Sample i is drawn from its own generator, seeded by the search seed and i alone, so the first 8
points of `samples: 12` are the points of `samples: 8`: a re-sweep with a larger count finds the
runs it has by their ids (a hash of their settings, as for grid points) and trains only the new
ones. Values are rounded to 6 significant digits, which keeps labels and run configs readable
and changes nothing a search can measure.

No numpy and no Optuna here: configs are expanded on login nodes.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

from hpcrl.config.sweep_spec import Distribution, SearchConfig


def _rounded(value: float, low: float, high: float) -> float:
    return min(max(float(f"{value:.6g}"), low), high)


def draw(dist: Distribution, rng: random.Random) -> Any:
    """One value of a distribution (both bounds included)."""
    if dist.type == "choice":
        return copy.deepcopy(dist.values[rng.randrange(len(dist.values))])
    assert dist.low is not None and dist.high is not None
    low, high = dist.low, dist.high
    if dist.type == "int":
        if not dist.log:
            return rng.randint(int(low), int(high))
        # Uniform in log space over [low, high + 1), floored: each integer gets its log-width share.
        return min(int(high), int(math.exp(rng.uniform(math.log(low), math.log(high + 1)))))
    if dist.type == "loguniform" or dist.log:
        return _rounded(math.exp(rng.uniform(math.log(low), math.log(high))), low, high)
    return _rounded(rng.uniform(low, high), low, high)


def random_points(search: SearchConfig) -> list[dict[str, Any]]:
    """The `samples` points of a random search: dotted key -> value, keys in sorted order."""
    assert search.samples is not None
    points = []
    for i in range(search.samples):
        rng = random.Random(f"hpcrl-search/{search.seed}/{i}")  # a str seed is hashed with SHA-512: stable across Pythons
        points.append({key: draw(search.space[key], rng) for key in sorted(search.space)})
    return points
