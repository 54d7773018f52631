"""An S3 endpoint that refuses body reads: ``python -m tests.fleet.refusing_s3 IP PORT UPSTREAM``.

Run on a lab host, it forwards to ``UPSTREAM`` (the origin's S3 server) and answers every
ranged GET with 403 AccessDenied, so a node pointed at it loads its manifest and can
read no piece from S3. Stops on SIGTERM.
"""

from __future__ import annotations

import signal
import sys

from tests.servers import FaultProxy, Faults


def main() -> None:
    ip, port, upstream = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with FaultProxy(upstream, Faults(fail_ranged_status=403), bind=(ip, port)):
        print("ready", flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
