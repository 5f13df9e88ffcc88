"""Percentiles and summaries shared by the benchmarks (run as ``python bench/<name>.py``, so this
module is importable as ``benchstats`` from the script's own directory)."""

from __future__ import annotations

from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); with few samples p99 ~ the max."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples: list[float]) -> dict[str, Any]:
    """n, p50, p99, min, max and the rounded samples (for the JSON results)."""
    return {
        "n": len(samples),
        "p50": percentile(samples, 0.50),
        "p99": percentile(samples, 0.99),
        "min": min(samples) if samples else None,
        "max": max(samples) if samples else None,
        "samples": [round(v, 3) for v in samples],
    }
