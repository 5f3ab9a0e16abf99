"""A managed child for the runner host's tests: appends to a file and sends UDP packets, forever.

argv: FILE [HOST PORT]. Each tick appends one line and sends one datagram (errors ignored: a
severed network may refuse the send); HOST "env" means $TENURE_HOST_ADDRESS (the host end of the
child's veth, which the runner host passes). Ignores SIGTERM when RUNNER_TEST_IGNORE_SIGTERM=1
(EXE-7's force-stop case). Stdlib only: it runs under spawn.py in its own namespace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time


def main() -> None:
    path = sys.argv[1]
    target = None
    if len(sys.argv) > 3:
        host = os.environ["TENURE_HOST_ADDRESS"] if sys.argv[2] == "env" else sys.argv[2]
        target = (host, int(sys.argv[3]))
    if os.environ.get("RUNNER_TEST_IGNORE_SIGTERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    count = 0
    with open(path, "a", buffering=1) as out:
        while True:
            count += 1
            out.write(f"{count} {time.time():.6f}\n")
            if target is not None:
                with contextlib.suppress(OSError):
                    sock.sendto(f"{count}".encode(), target)
            time.sleep(0.002)


if __name__ == "__main__":
    main()
