"""Send N requests to ``echo`` and print the answers and the timing.

``python tools/client_example.py [FRONTEND] [N]``; FRONTEND defaults to tcp://127.0.0.1:5555.
Run tools/echo_worker.py (and a broker) first.
"""

from __future__ import annotations

import sys
import time

from scale0.net.client import Client


def main() -> None:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    with Client(endpoint, timeout=5.0) as client:
        config = client.connect()
        print(f"connected: family {config.family}, config version {config.version}")
        started = time.perf_counter()
        for number in range(count):
            reply = client.request("echo", f"hello {number}".encode())
            print(b" ".join(reply).decode())
        one_by_one = time.perf_counter() - started
        started = time.perf_counter()
        client.request_many("echo", (b"x" for _ in range(count)), window=100)
        pipelined = time.perf_counter() - started
    print(f"{count} requests: {one_by_one * 1000:.1f} ms one by one, ", end="")
    print(f"{pipelined * 1000:.1f} ms pipelined")


if __name__ == "__main__":
    main()
