"""How the scoreboard is shown: progress, the table (markdown) and the plot of the outcome mix per
configuration (a stacked bar each; matplotlib with the Agg backend, imported only to draw)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.faults.outcomes import OUTCOMES, ConfigResult, percentile

__all__ = [
    "LABELS",
    "SEED_COMPLETION",
    "Progress",
    "plot_outcomes",
    "render_details",
    "render_table",
    "say",
]


def say(message: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


LABELS = {
    "unmanaged": "1 unmanaged",
    "log-only": "2 log only",
    "saga-memory": "3 saga, no durable log",
    "tenure": "4 Tenure",
}
# DUR-3: the seed's completion rates on the same fault profile (SPEC.md).
SEED_COMPLETION = {"unmanaged": 14.2, "log-only": 38.6, "saga-memory": 49.1, "tenure": 94.8}


@dataclass
class Progress:
    total: int
    label: str
    enabled: bool
    _bar: Any = None
    _last: float = 0.0
    done: int = 0

    def __post_init__(self) -> None:
        if self.enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(
                    total=self.total, desc=self.label, unit="traj", file=sys.stderr, mininterval=1.0
                )
            except ImportError:
                self._bar = None

    def update(self, note: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
            if note:
                self._bar.set_postfix_str(note, refresh=False)
        elif self.enabled and (time.monotonic() - self._last > 5 or self.done == self.total):
            self._last = time.monotonic()
            say(f"{self.label}: {self.done}/{self.total} trajectories {note}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _fmt_s(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"  # NaN: no sample


def render_table(results: Sequence[ConfigResult]) -> str:
    head = (
        "| configuration | completed | clean | seed's completed | aborted | escalated | corrupted | "
        "duplicate effects | orphaned resources | RPO (lost turns) | RTO median s | RTO p99 s | MTTR s | "
        "kills (runner/Tenure) | turns | wall s |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        seed = SEED_COMPLETION.get(r.config)
        rows.append(
            f"| {LABELS.get(r.config, r.config)} | {r.completion_rate:.1f}% | {r.clean_rate:.1f}% | "
            f"{'-' if seed is None else f'{seed:.1f}%'} | {r.counts.get('cleanly-aborted', 0)} | "
            f"{r.counts.get('escalated', 0)} | {r.counts.get('corrupted', 0)} | {r.duplicates} | "
            f"{r.orphans} | "
            f"{r.rpo_turns} | {_fmt_s(r.rto_median)} | {_fmt_s(r.rto_p99)} | {_fmt_s(r.mttr_mean)} | "
            f"{r.runner_kills}/{r.tenure_kills} | {r.turns} | {r.wall_s:.1f} |"
        )
    return "\n".join(rows)


def render_details(results: Sequence[ConfigResult]) -> str:
    lines = [
        "| configuration | runner said | corruption reasons | semantic duplicates (env) | notes |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        said = ", ".join(f"{k} {v}" for k, v in sorted(r.reported.items()))
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r.reasons.items())) or "-"
        notes = []
        if r.runner_errors:
            notes.append(f"{r.runner_errors} runner errors")
        if r.timeouts:
            notes.append(f"{r.timeouts} timeouts")
        if r.stray_resources:
            notes.append(f"{r.stray_resources} resources matching no turn")
        if r.tenure_restart_s:
            notes.append(
                f"Tenure process restart median {percentile(r.tenure_restart_s, 50):.2f}s, "
                f"max {max(r.tenure_restart_s):.2f}s"
            )
        lines.append(
            f"| {LABELS.get(r.config, r.config)} | {said} | {reasons} | {r.semantic_duplicates} | "
            f"{'; '.join(notes) or '-'} |"
        )
    return "\n".join(lines)


COLOURS = {
    "completed": "#2e7d32",
    "cleanly-aborted": "#1565c0",
    "escalated": "#f9a825",
    "corrupted": "#c62828",
}


def plot_outcomes(
    results: Sequence[ConfigResult],
    path: Path,
    *,
    labels: dict[str, str] | None = None,
    seed_completion: dict[str, float] | None = None,
    title: str = "",
) -> Path:
    """Draw one bar per configuration (outcome shares in %, stacked) and the seed's completion
    rate as a black tick; write it as a PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or {}
    names = [labels.get(r.config, r.config) for r in results]
    figure, axes = plt.subplots(figsize=(max(5.0, 2.2 * len(results) + 2), 4.8), dpi=120)
    bottoms = [0.0] * len(results)
    for outcome in OUTCOMES:
        shares = [r.rate(outcome) for r in results]
        axes.bar(
            names, shares, bottom=bottoms, color=COLOURS[outcome], label=outcome.replace("-", " "), width=0.6
        )
        for i, share in enumerate(shares):
            if share >= 6:
                axes.text(
                    i,
                    bottoms[i] + share / 2,
                    f"{share:.1f}%",
                    ha="center",
                    va="center",
                    color="white",
                    fontsize=8,
                )
        bottoms = [b + s for b, s in zip(bottoms, shares, strict=True)]
    if seed_completion:
        labelled = False
        for i, result in enumerate(results):
            seed = seed_completion.get(result.config)
            if seed is not None:
                axes.hlines(
                    seed,
                    i - 0.36,
                    i + 0.36,
                    colors="black",
                    linewidth=2,
                    label="_nolegend_" if labelled else "seed's completion",
                )
                labelled = True
    axes.set_ylabel("trajectories (%)")
    axes.set_ylim(0, 100)
    axes.set_title(title or "Outcome of every trajectory, from the environment's audit")
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
