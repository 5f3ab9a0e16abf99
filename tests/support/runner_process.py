"""A real runner process for tests: claims a run with the SDK, renews, and keeps sending effects.

Every attempt and its result is appended to a JSON Lines file, so a test can SIGSTOP/SIGCONT this
process and read afterwards exactly what it tried and what landed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from services.runner_sdk import LeaseKeeper, TenureClient


def _log(out: Path, **entry: Any) -> None:
    entry["at"] = time.time()
    with out.open("a") as f:
        f.write(json.dumps(entry, default=str) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--run", required=True)
    parser.add_argument("--runner", default="runner-a")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--lease", type=int, default=3)
    parser.add_argument("--heartbeat", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    client = TenureClient(args.api, args.gateway, api_key=args.api_key, timeout_s=5.0)
    keeper = LeaseKeeper.claim(client, args.run, args.runner, [], args.lease, args.heartbeat)
    _log(args.out, event="claimed", epoch=keeper.lease.epoch, attemptId=keeper.lease.attempt_id)
    deadline = time.monotonic() + args.seconds
    with keeper:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            key = f"{args.runner}-{args.run}-{i}"
            try:
                result = keeper.send_effect(
                    key, "ledger", "credit", {"account": f"acct-{args.run}", "amount": 1}
                )
                _log(args.out, event="effect", key=key, outcome=result.outcome, certainty=str(keeper.state))
            except Exception as exc:  # every refusal is evidence for the test
                _log(
                    args.out, event="refused", key=key, error=type(exc).__name__, certainty=str(keeper.state)
                )
            time.sleep(0.2)


if __name__ == "__main__":
    main()
