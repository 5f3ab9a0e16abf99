"""The managed runner host (issue 14; QUA-1, EXE-7): a small Tenure process that runs one agent
command for one run as a contained child, holds its lease through the runner SDK, and carries
out Tenure's instructions: on quarantine, freeze the child's tree FIRST, then sever its network,
then report each stage; on cancel, SIGTERM, a grace period, SIGKILL, and confirm.

  freezer.py  Freezer: cgroup v2 `cgroup.freeze`, cgroup v1 `freezer`, SIGSTOP (by probing)
  network.py  Network: own netns + veth (sever = link down), or none ("unavailable")
  spawn.py    the exec wrapper that enrols the child before it runs
  child.py    ManagedChild: start, contain (timed), terminate / force_stop, close
  control.py  QuarantineChannel: the long-poll and the stage reports (full-jitter retries)
  host.py     RunnerHost: claim, launch, supervise, report
  __main__.py `python -m services.runner_host --run-id RUN -- COMMAND...`
"""

from services.runner_host.child import Containment, ContainmentTimes, ManagedChild
from services.runner_host.control import QuarantineChannel, QuarantineView, StageReport
from services.runner_host.host import HostConfig, HostResult, RunnerHost

__all__ = [
    "Containment",
    "ContainmentTimes",
    "HostConfig",
    "HostResult",
    "ManagedChild",
    "QuarantineChannel",
    "QuarantineView",
    "RunnerHost",
    "StageReport",
]
