"""The block policy (EXE-2): which principals and tenants may not have runs assigned right now.

Operators change it through the API, which publishes BlockChanged on the compacted
`tenure.policy` topic; every process that needs it (the coordinator deciding claims, the API
answering questions) follows the topic from the start into memory. Subjects are named
"principal:<name>" and "tenant:<id>".
"""

from __future__ import annotations

import threading
import time

from services.common.contracts import BlockChanged
from services.common.kafka import TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.topics import POLICY

__all__ = ["BlockList", "subject_key"]


def subject_key(kind: str, subject: str) -> str:
    return f"{kind}:{subject}"


class BlockList:
    def __init__(self, bootstrap_servers: str, client_id: str) -> None:
        self._codec = MessageCodec()
        self._blocked: dict[str, BlockChanged] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._follower = TopicFollower(bootstrap_servers, [POLICY.name], "beginning", client_id=client_id)
        self._targets = {p: end for p, end in self._follower.end_offsets(POLICY.name).items() if end > 0}
        self._caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="block-policy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for record in self._follower.poll(timeout_s=0.1):
                try:
                    change = self._codec.decode(record.value)
                except UndecodableRecord:
                    continue
                if isinstance(change, BlockChanged):
                    key = subject_key(change.subject_kind, change.subject)
                    with self._lock:
                        if change.blocked:
                            self._blocked[key] = change
                        else:
                            self._blocked.pop(key, None)
            if not self._caught_up.is_set():
                positions = self._follower.positions(POLICY.name)
                if all(positions.get(p, -1) >= end for p, end in self._targets.items()):
                    self._caught_up.set()
        self._follower.close()

    def wait_until_current(self, timeout_s: float = 30.0) -> bool:
        return self._caught_up.wait(timeout_s)

    def blocked(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._blocked)

    def entries(self) -> list[BlockChanged]:
        with self._lock:
            return sorted(self._blocked.values(), key=lambda b: (b.subject_kind, b.subject))

    def wait_for(self, key: str, blocked: bool, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (key in self.blocked()) == blocked:
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
