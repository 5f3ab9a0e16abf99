"""The semantic watchdog's cost per observation (issue 12), in-process, one core.

A workload of R runs x S steps each, interleaved as a partition would see them: ordinary work
(reads, edits reaching new states, test runs whose metrics improve), declared polls whose
observation changes, transient errors, and now and then a loop (the seed's edit/revert orbit),
so every detector and the ladder do their work. For every observation it times, with
perf_counter_ns:
  detect          the detectors alone (WD-2..WD-4) against the state before the observation;
  decide+evolve   what the processor's `decide` does per command: validate, deduplicate, detect,
                  climb the ladder, build the events and fold them (no Kafka, no RocksDB);
  state codec     encoding the run's state for the store and decoding it again (the processor
                  writes each changed state once per batch).
Twice: with the deployment defaults (K=8, W=32, E=6) and at the bounds' maximum (K=32, W=256).

    python -m bench.watchdog_detectors [--observations 100000] [--runs 1000]

A script, not a test: it measures and reports, it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from services.common.contracts import ObserveStep
from services.common.ids import action_hash, run_id_for
from services.watchdog.domain import Rejection, Thresholds, WatchdogState, decide, detect, evolve
from services.watchdog.state_codec import decode_state, encode_state

__all__ = ["main"]

T0 = 1_767_225_600_000


def _hash(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


@dataclass
class _Run:
    run_id: str
    seq: int = 0
    passing: int = 0
    looping: int = 0  # steps of a loop still to play

    def next(self, rng: random.Random) -> ObserveStep:
        self.seq += 1
        seq, roll = self.seq, rng.random()
        kw: dict[str, object] = {"state_hash": _hash(f"{self.run_id}/{seq}"), "mutating": True}
        if self.looping or roll < 0.03:
            self.looping = self.looping - 1 if self.looping else 6
            edit = self.looping % 2 == 0
            tool, args = "fs.edit", {"line": 42, "strict": edit}
            kw["state_hash"] = _hash(f"{self.run_id}/loop/{edit}")
        elif roll < 0.25:
            tool, args, kw["mutating"] = "fs.read", {"path": f"f{seq % 7}.py"}, False
        elif roll < 0.40:
            self.passing += rng.choice((0, 1, 1, 2))
            tool, args, kw["mutating"] = "pytest", {"args": ["-q"]}, False
            kw["metrics"] = (float(self.passing), -float(max(0, 10 - self.passing)))
        elif roll < 0.48:
            tool, args, kw["polling"], kw["mutating"] = "jobs.status", {"job": 7}, True, False
            kw["summary"] = f"running {seq}%"
        elif roll < 0.53:
            tool, args, kw["error_kind"] = "http.post", {"url": "/deploy"}, "transient"
        else:
            tool, args = "fs.edit", {"line": seq, "text": f"v{seq}"}
        return ObserveStep(
            command_id=f"obs-{self.run_id}-{seq}",
            run_id=self.run_id,
            issued_at=T0 + seq,
            correlation_id=self.run_id,
            actor="bench",
            source="runner",
            step_seq=seq,
            tool=tool,
            action_hash=action_hash(tool, args),
            **kw,  # type: ignore[arg-type]
        )


def _workload(observations: int, runs: int, seed: int = 7) -> Iterator[ObserveStep]:
    rng = random.Random(seed)
    pool = [_Run(run_id_for("bench", f"run-{i}")) for i in range(runs)]
    for _ in range(observations):
        yield rng.choice(pool).next(rng)


def _percentile(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0  # ns -> µs


def _measure(thresholds: Thresholds, observations: int, runs: int) -> dict[str, list[int]]:
    states: dict[str, WatchdogState | None] = {}
    timings: dict[str, list[int]] = {"detect": [], "decide+evolve": [], "state codec": []}
    clock: Callable[[], int] = time.perf_counter_ns
    now = T0
    levels = [0, 0, 0]
    for obs in _workload(observations, runs):
        now += 1
        state = states.get(obs.run_id)
        if state is not None:
            started = clock()
            detect(state, obs, state.turn + 1)
            timings["detect"].append(clock() - started)
        started = clock()
        decision = decide(state, obs, now, thresholds)
        if not isinstance(decision, Rejection):
            for event in decision:
                state = evolve(state, event)
        timings["decide+evolve"].append(clock() - started)
        if isinstance(decision, Rejection):
            states[obs.run_id] = None  # a deadlocked run: start it again, like a new run
            continue
        levels = [
            n + sum(1 for e in decision if getattr(e, "level", 0) == i + 1) for i, n in enumerate(levels)
        ]
        assert state is not None
        started = clock()
        decode_state(encode_state(state))
        timings["state codec"].append(clock() - started)
        states[obs.run_id] = state
    print(f"  interventions issued: level 1 {levels[0]}, level 2 {levels[1]}, level 3 {levels[2]}")
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--observations", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1_000)
    args = parser.parse_args(argv)
    print(f"watchdog detectors: {args.observations} observations over {args.runs} runs, one core")
    print(f"  python {platform.python_version()} on {platform.machine()}, {platform.processor() or 'cpu'}")
    rows = []
    for label, thresholds in (
        ("defaults K=8 W=32 E=6", Thresholds()),
        ("maximum K=32 W=256 E=100", Thresholds(max_period=32, window=256, epoch_steps=100)),
    ):
        print(f"- {label}")
        for what, samples in _measure(thresholds, args.observations, args.runs).items():
            mean = statistics.fmean(samples) / 1000.0
            rows.append(
                (label, what, len(samples), _percentile(samples, 0.5), _percentile(samples, 0.99), mean)
            )
    print()
    columns = ("thresholds", "per observation", "samples", "p50 µs", "p99 µs", "mean µs", "obs/s, 1 core")
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, what, n, p50, p99, mean in rows:
        print(f"| {label} | {what} | {n} | {p50:.1f} | {p99:.1f} | {mean:.1f} | {1e6 / mean:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
