"""A runner made of nothing but the SDK's Worker, run as its own process by the SDK tests.

    python sdk_worker_main.py API_URL QUEUE RUNNER_ID IDLE_EXIT_S [WORK_S]

Imports `tenure_sdk` (the distribution, sdk/) when it is installed, else the repository's
services.runner_sdk, so the same script runs in a clean venv and in the development one. Each
run's outcome is printed as one JSON line; the process exits after IDLE_EXIT_S without work.
"""

from __future__ import annotations

import json
import sys
import time

try:
    import tenure_sdk as sdk
except ImportError:  # the repository's venv: the same code under its source path
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    import services.runner_sdk as sdk  # type: ignore[no-redef]


def main() -> int:
    api_url, queue, runner_id, idle_exit_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    work_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.1
    client = sdk.TenureClient(api_url, api_url, timeout_s=10.0)
    worker = sdk.Worker(client, runner_id, lease_seconds=15, heartbeat_seconds=2, poll_s=1)

    @worker.task(queue)
    def handle(task: sdk.Task) -> list[dict[str, object]]:
        if task.spec.get("fail"):
            raise sdk.TaskFailed("ASKED_TO_FAIL", "the spec said so")
        time.sleep(work_s)
        return []

    for outcome in worker.run(idle_exit_s=idle_exit_s):
        print(json.dumps({"runId": outcome.run_id, "outcome": outcome.outcome, "runner": runner_id}))
    print(json.dumps({"done": runner_id, "module": sdk.__name__}), flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
