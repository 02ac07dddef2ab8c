"""scale0-coordinator and scale0-node as real processes behind a real broker: bad input,
restart with everything kept, bad configs."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from scale0.config.model import Admin
from scale0.crypto.passwords import hash_password
from scale0.net.client import Client
from scale0.tasks.client import TaskClient, TaskError
from scale0.testing import running_broker
from tests.tasks.processes import coordinator, node, running

FAST = {"default_heartbeat_interval_ms": 200, "liveness": 5}


def test_bad_input_gets_errors_and_a_restart_keeps_everything(tmp_path: Path) -> None:
    (tmp_path / "broker").mkdir()
    with running_broker(tmp_path / "broker", **FAST) as broker:
        frontend = broker.endpoints["frontend"]
        coord = coordinator(tmp_path, broker.endpoints["backend"], node_timeout_s=2.0)
        worker = node(tmp_path, "n1", frontend, capabilities={"memory": 1000, "cores": 1})
        with running(coord, worker), TaskClient(frontend) as tasks:
            tasks.connect("me")
            done = tasks.submit("square", [9], "sq")
            assert tasks.result(done) == 81
            with Client(frontend, timeout=5.0) as raw:
                garbage = json.loads(raw.request("zerotask", b"{nope")[0])
                assert garbage["error"]["code"] == -32700
                wrong = json.loads(raw.request("zerotask", b'{"jsonrpc":"1.0","id":1}')[0])
                assert wrong["error"]["code"] == -32600
                unknown = json.loads(raw.request("vespid", b'{"command":"task-fly"}')[0])
                assert unknown["code"] == -32601
            with pytest.raises(TaskError) as caught:
                tasks.call("client_new_task", ["me", 5, 1])
            assert caught.value.code == -32602
            with pytest.raises(TaskError) as caught:
                tasks.submit("square", [1], "sq")
            assert caught.value.code == -32001
            with pytest.raises(TaskError) as caught:
                tasks.create("big", "print(1)", requirements={"memory": 5000, "cores": "two"})
            assert caught.value.code == -32010
            tasks.create("boom", "raise SystemExit(4)")
            tasks.create("loud", "import sys\nsys.stdout.write('x' * (3 << 20))\n")
            assert tasks.wait_complete("boom")["success"] == "error"
            assert tasks.wait_complete("loud")["success"] == "ok"  # under max_log_mb
            failing = tasks.submit("fail", ["no way"], "f")
            with pytest.raises(TaskError) as caught:
                tasks.result(failing)
            assert caught.value.code == -32009
            assert caught.value.data["message"] == "no way"
            coord.kill()
            coord.start()
            assert tasks.result(done) == 81  # the restarted coordinator kept it
            assert tasks.info("boom")["success"] == "error"
            assert tasks.result(tasks.submit("add", [1, 2])) == 3
            assert coord.alive() and worker.alive()
        assert worker.process is not None and worker.process.returncode == 0


@pytest.mark.parametrize("kind", ["coordinator", "node"])
def test_bad_config_exits_2_naming_the_field(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("endpoint: tcp://127.0.0.1:1\nname: n\npath: p\ndata_dir: d\nbogus: 1\n")
    result = subprocess.run(
        [f"scale0-{kind}", "--config", str(path)], capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert b"bad.yaml" in result.stderr


def test_an_http_port_in_use_exits_2_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = tmp_path / "coordinator.yaml"
        path.write_text(f"endpoint: tcp://127.0.0.1:1\ndata_dir: d\nhttp_port: {port}\n")
        result = subprocess.run(
            ["scale0-coordinator", "--config", str(path)],
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 2
    assert f"http_port: cannot listen on 127.0.0.1:{port}" in result.stderr.decode()


def test_only_admins_create_tasks_when_admins_from_is_set(tmp_path: Path) -> None:
    admins = (
        Admin("boss", hash_password("pw-boss", n=2**4), "admin"),
        Admin("viewer", hash_password("pw-view", n=2**4), "read"),
    )
    (tmp_path / "broker").mkdir()
    with running_broker(tmp_path / "broker", admins=admins, **FAST) as broker:
        frontend = broker.endpoints["frontend"]
        coord = coordinator(
            tmp_path, broker.endpoints["backend"], admins_from=str(broker.network_file)
        )
        worker = node(tmp_path, "n1", frontend, capabilities={"memory": 1000, "cores": 1})
        with running(coord, worker):
            with TaskClient(frontend) as anonymous:
                with pytest.raises(TaskError) as caught:
                    anonymous.submit("square", [2])
                assert caught.value.code == -32008
                with pytest.raises(TaskError) as caught:
                    anonymous.create("job", "print(1)")
                assert caught.value.code == -32008
            viewer = TaskClient(frontend, auth_id="viewer", auth_password="pw-view")
            with viewer, pytest.raises(TaskError):
                viewer.create("job", "print(1)")
            with TaskClient(frontend, auth_id="boss", auth_password="pw-boss") as boss:
                assert boss.result(boss.submit("square", [5])) == 25
                boss.create("job", "print(1)")
                assert boss.wait_complete("job")["success"] == "ok"
                assert boss.info("job")["command"] == "task-info-response"
    log = coord.stderr.read_text()
    assert "task request refused" in log
    assert "'viewer'" in log


def test_one_request_per_task_with_many_in_flight(tmp_path: Path) -> None:
    """K4: submit_each and results send one request per task, a window of them at once; the
    answers come back in the order asked, a failed task raises its own TaskError, and a
    refused create raises while the rest are still created."""
    (tmp_path / "broker").mkdir()
    with running_broker(tmp_path / "broker", **FAST) as broker:
        frontend = broker.endpoints["frontend"]
        coord = coordinator(tmp_path, broker.endpoints["backend"])
        worker = node(tmp_path, "n1", frontend, slots=8)
        with running(coord, worker), TaskClient(frontend) as tasks:
            tasks.connect("me")
            ids = tasks.submit_each([("square", [i]) for i in range(60)], window=16)
            assert len(set(ids)) == 60
            assert tasks.results(ids, window=16) == [i * i for i in range(60)]
            assert tasks.results(ids[:3], window=1) == [0, 1, 4]  # already complete
            failing = tasks.submit_each([("square", [2]), ("fail", ["no"])], window=2)
            with pytest.raises(TaskError) as caught:
                tasks.results(failing, window=2)
            assert caught.value.code == -32009
            assert caught.value.data["message"] == "no"
            with pytest.raises(TaskError) as caught:
                tasks.submit_each([("square", [3]), (5, [3])], window=2)  # type: ignore[list-item]
            assert caught.value.code == -32602
            counts = tasks.command("task-list")["counts"]
            states = ("waiting", "pending", "running", "complete")
            assert sum(counts[state] for state in states) == 63, counts  # the valid one too
