"""A process that owns the Run and the Trajectory of every partition and drives durable steps
through one group committer, on a real broker and real RocksDB (issue 11): the process that
tests/integration/test_joint_unit_kill.py SIGKILLs mid-stream and then runs again.

`python -m tests.support.owner_worker BOOTSTRAP STATE_DIR TAG RUNS STEPS` opens RUNS runs (the
tenants spread over the partitions) and takes STEPS steps in each, eight runs at a time. A step
is two requests, each one joint unit: the step's intent and then the effect's intent it leads
to; the effect's outcome and the step's commit. Every command's id is derived from the run and
the step, so a second incarnation that starts over finds what the first one decided and
decides only the rest. Each answered step is appended to STATE_DIR/progress; "done" ends the
file when every step was answered.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from services.common.aggregate.changes import Verdict
from services.common.aggregate.group_commit import Ask
from services.common.clock import SystemClock
from services.common.eventlog import KafkaEventLog
from services.common.store import RocksStore
from tests.support.owner_flow import (
    RUN,
    TRAJECTORY,
    Lease,
    claim,
    effect_intent_after,
    owner_of,
    propose,
    start,
    step_done,
    submit,
)

__all__ = ["main"]


def main(argv: list[str]) -> int:
    bootstrap, state_dir, tag, runs, steps = argv[0], Path(argv[1]), argv[2], int(argv[3]), int(argv[4])
    clock = SystemClock()
    log = KafkaEventLog(bootstrap, f"tenure-test-owner-{tag}")  # one writer: it fences the last incarnation
    owner = owner_of(log, RocksStore(state_dir / "runs"), RocksStore(state_dir / "trajectories"), clock)
    owner.committer.start()
    progress = open(state_dir / "progress", "a", buffering=1)  # noqa: SIM115  (closed by the process's end)
    written = threading.Lock()

    def workflow(index: int) -> None:
        command = submit(f"{tag}-{index}", clock.now_ms(), tenant=f"{tag}-tenant-{index % 8}")
        run_id = command.run_id
        owner.committer.submit(Ask(RUN, command)).result(30)
        (claimed,) = owner.committer.submit(Ask(RUN, claim(run_id, clock.now_ms()))).result(30)
        lease = Lease(run_id, claimed.state.lease.attempt_id, claimed.state.lease.epoch)
        owner.committer.submit(Ask(TRAJECTORY, start(lease, clock.now_ms()))).result(30)
        for step in range(steps):
            now = clock.now_ms()
            answers = owner.committer.submit(
                Ask(TRAJECTORY, propose(lease, f"s{step}", now)), effect_intent_after(lease, now)
            ).result(30)
            outcomes = [a.verdict.outcome for a in answers]
            first, then = step_done(lease, answers[0].state.steps[step], clock.now_ms())
            committed = owner.committer.submit(first, then).result(30)
            outcomes += [a.verdict.outcome for a in committed]
            assert all(o in (Verdict.ACCEPTED, Verdict.DUPLICATE) for o in outcomes), outcomes
            with written:
                progress.write(f"{run_id} {step}\n")

    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(workflow, index) for index in range(runs)]:
            future.result()
    progress.write("done\n")
    owner.committer.stop()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
