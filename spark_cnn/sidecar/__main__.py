"""`python -m spark_cnn.sidecar ...`: the sidecar process, as the launcher starts it.

The command line is what operators see in `ps`; it holds no secret (the access token is generated here and
written only to the 0600 info file).
"""

from __future__ import annotations

import argparse
import logging
import sys

from spark_cnn.sidecar.server import SidecarSettings, run
from spark_cnn.task.launcher import DEFAULT_IDLE_TIMEOUT_S
from spark_cnn.task.procs import ProcessId


def parse_args(argv: list[str]) -> SidecarSettings:
    parser = argparse.ArgumentParser(prog="python -m spark_cnn.sidecar", description=__doc__)
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    parser.add_argument("--info", required=True, help="where to write pid, socket, device and token (0600)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, help="seconds")
    parser.add_argument("--watch-pid", type=int, help="exit when this process ends (the executor JVM)")
    parser.add_argument("--watch-start-time", type=int, default=0, help="its start time, against pid reuse")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's, all cores)")
    parser.add_argument("--lock-fd", type=int, help="the start lock's descriptor, closed once the info file is out")
    parser.add_argument("--app-id", default="")
    parser.add_argument("--executor-id", default="")
    args = parser.parse_args(argv)
    return SidecarSettings(
        socket_path=args.socket, info_path=args.info, device=args.device,
        idle_timeout_s=args.idle_timeout,
        watch=ProcessId(args.watch_pid, args.watch_start_time) if args.watch_pid else None,
        app_id=args.app_id, executor_id=args.executor_id, threads=args.threads, lock_fd=args.lock_fd)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s sidecar[%(process)d] %(message)s")
    run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
