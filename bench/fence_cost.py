"""What the generation fence costs a transaction (issue 16; docs/architecture.md, "Scale-out").

One TransactionalWriter against a bundled broker of its own: transactions of 10 records without
and with `send_offsets_to_transaction` (the fence), alternated twice. Run from the repo root:
    .venv/bin/python bench/fence_cost.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from services.common import broker as launcher
from services.common.kafka import GroupFence, OutboundRecord, TransactionalWriter, create_topics
from services.common.topics import TopicSpec

WARM_UP, MEASURED = 50, 400


def main() -> None:
    handle = launcher.start_broker(state_dir=Path(tempfile.mkdtemp(prefix="fence-cost-")))
    try:
        bootstrap = handle.bootstrap_servers
        create_topics(
            bootstrap,
            [
                TopicSpec(name="bench.events", partitions=4, config={}),
                TopicSpec(name="bench.commands", partitions=4, config={}),
            ],
        )
        writer = TransactionalWriter(bootstrap, "bench-fence")
        records = [
            OutboundRecord("bench.events", key=b"k%d" % i, value=b"x" * 200, partition=i % 4)
            for i in range(10)
        ]

        def fence(i: int) -> GroupFence:
            # generation -1: the broker skips the generation check but does every round trip.
            return GroupFence("bench-fence-group", -1, "", None, "bench.commands", {0: i + 1, 1: i + 1})

        for label, fenced in 2 * (("no fence", False), ("fence", True)):
            for i in range(WARM_UP):
                writer.commit(records, fence=fence(i) if fenced else None)
            began = time.perf_counter()
            for i in range(MEASURED):
                writer.commit(records, fence=fence(WARM_UP + i) if fenced else None)
            per = (time.perf_counter() - began) / MEASURED * 1000
            print(f"{label:>8}: {per:.2f} ms per transaction of {len(records)} records")
        writer.close()
    finally:
        handle.stop()


if __name__ == "__main__":
    main()
