"""Serve the ``echo`` service (the body back, as is): ``python tools/echo_worker.py [BACKEND]``.

BACKEND defaults to tcp://127.0.0.1:5556 (the backend port of conf/'s example broker). Ctrl-C
stops it. The handler is scale0.net.worker.echo_handler.
"""

from __future__ import annotations

import logging
import signal
import sys

from scale0.net.worker import Worker, echo_handler


def main() -> None:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5556"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    worker = Worker(endpoint, {"echo": echo_handler}, capacity=4)
    signal.signal(signal.SIGINT, lambda _signum, _frame: worker.stop())
    signal.signal(signal.SIGTERM, lambda _signum, _frame: worker.stop())
    print(f"serving echo behind {endpoint}; Ctrl-C stops", flush=True)
    worker.run()


if __name__ == "__main__":
    main()
