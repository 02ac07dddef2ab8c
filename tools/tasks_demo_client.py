"""The tasks demo's client: zerotask and vespid tasks through the broker at argv[1]."""

from __future__ import annotations

import sys

from scale0.tasks.client import TaskClient, TaskError

SCRIPT = "import os\nprint('hello from', os.environ['VESPID_TASK'])\n"


def main(endpoint: str) -> None:
    with TaskClient(endpoint, timeout=5.0) as client:
        client.connect()
        ids = [client.submit("square", [i]) for i in range(10)]
        print("zerotask square 0..9 ->", [client.result(task) for task in ids])
        print("zerotask add(2, 40) ->", client.result(client.submit("add", {"a": 2, "b": 40})))
        client.create("demo-small", SCRIPT, requirements={"memory": 256})
        client.create(
            "demo-conda",
            SCRIPT,
            requirements={"memory": 4096, "cores": 2},
            repositories={"env": {"request": "conda", "local": True}},
        )
        client.create(
            "demo-child", SCRIPT, parent="demo-small", requirements={"usage_require_astro": True}
        )
        client.create("demo-huge", SCRIPT, requirements={"memory": 1 << 20})
        for name in ("demo-small", "demo-conda", "demo-child"):
            info = client.wait_complete(name, wait_s=30)
            print(f"vespid {name}: {info['status']} {info['success']} on {info['node']}")
        print("vespid demo-huge:", client.info("demo-huge")["explain"])
        client.command("task-cancel", name="demo-huge")
        try:
            client.create("demo-small", "print('another')")
        except TaskError as exc:
            print("a taken name is refused:", exc)


if __name__ == "__main__":
    main(sys.argv[1])
