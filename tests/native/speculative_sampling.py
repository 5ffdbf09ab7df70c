"""What the sampled-output tests of every drafter share (test_speculative_draft_model.py,
test_speculative_mtp.py): seeded draws of a few generated positions, and a two-sample
chi-square test that those with speculation follow the distribution of those without.

Why statistical: speculative sampling keeps a draft with probability min(1, p/q) and else
redraws from max(0, p - q), so single draws differ from plain decoding's while the
distribution must not."""

from __future__ import annotations

import math
from collections import Counter

from .conftest import run_all

POSITIONS = 3  # generated positions 1..3: position 0 comes from the prefill, never verified


def chi_square_z(a: Counter, b: Counter) -> float | None:
    """Two-sample chi-square homogeneity test of two token histograms (tokens seen fewer than
    10 times in both pooled into one bin), as a Wilson-Hilferty z score: ~N(0, 1) when both
    come from the same distribution."""
    keys = [t for t in set(a) | set(b) if a[t] + b[t] >= 10]
    rest_a = sum(a.values()) - sum(a[t] for t in keys)
    rest_b = sum(b.values()) - sum(b[t] for t in keys)
    rows = [(a[t], b[t]) for t in keys] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for x, y in rows:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (observed - expected) ** 2 / expected
    k = len(rows) - 1
    if k < 2:
        return None  # (nearly) one token: nothing to compare
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


def sampled_positions(  # type: ignore[no-untyped-def]
    engine, prompt: list[int], spec: dict, draws: int, seed_base: int = 0
) -> list[Counter]:
    """Histograms of generated positions 1..3 over `draws` seeded samples at temperature 1
    (seeds seed_base.., 64 requests batched at a time)."""
    out = [Counter() for _ in range(POSITIONS)]
    for start in range(0, draws, 64):
        reqs = {
            f"s{seed}": {
                "prompt": prompt,
                "max_tokens": POSITIONS + 1,
                "temperature": 1.0,
                "seed": seed_base + seed,
                **spec,
            }
            for seed in range(start, min(start + 64, draws))
        }
        for res in run_all(engine, reqs).values():
            for i, token in enumerate(res["tokens"][1 : POSITIONS + 1]):
                out[i][token] += 1
    return out


def assert_same_distribution(
    with_spec: list[Counter], plain: list[Counter], label: str = ""
) -> None:
    """Every position spread over several tokens passes the test at z < 4, and at least two
    positions were spread enough to test (the seeds of the two runs differ: distributions are
    compared, not draws)."""
    tested = 0
    for i in range(POSITIONS):
        z = chi_square_z(with_spec[i], plain[i])
        if z is None:
            continue
        tested += 1
        assert z < 4.0, (label, i, z, with_spec[i].most_common(5), plain[i].most_common(5))
    assert tested >= 2, label
