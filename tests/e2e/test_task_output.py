"""A pipeline sees its task's output: a real agent captures it, ships it through its outbox to the live
plane, and the API and the CLI show it, complete and in order, live, through a plane outage, under the
cap; a command that cannot start fails with the launcher's words, which reach `submit --wait`."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.apps.fleet.conftest import assign
from tests.e2e.conftest import ROOT, wait_for
from tests.e2e.test_plane_and_agents import H100_NODE

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# 10,000 numbered lines on stdout, and every 2,500th line also a line on stderr; slow enough (about
# 2 s) that the output is followed while the task runs.
PRINTER = (
    "import sys, time\n"
    "for i in range(10000):\n"
    "    print(f'out {i:05d}', flush=True)\n"
    "    if i % 2500 == 0:\n"
    "        print(f'err {i:05d}', file=sys.stderr, flush=True)\n"
    "    if i % 500 == 0:\n"
    "        time.sleep(0.1)\n"
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory this test and its task (run as its tenant's uid, with a /tmp of its own) both reach:
    pytest's tmp_path lies under /tmp (its /tmp/pytest-of-root is root-only), which a root agent's runs
    no longer see (docs/isolation.md, the process runtime). /var/tmp is the host's, shared as it is."""
    path = Path(tempfile.mkdtemp(prefix="whalegen-e2e-", dir="/var/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _registered(fleet: Any) -> bool:
    return fleet.node.gpus.filter(uuid__startswith="GPU-").count() == 2


def _token(fleet: Any) -> str:
    from apps.tenants.services import token_create

    return token_create(user=fleet.alice, tenant=fleet.tenant_a, name="ci")[1]


def _run(task: Any, command: list[str], fleet: Any) -> Any:
    task.command = command
    task.save(update_fields=["command"])
    assign(task, fleet.node, [fleet.whole_unit])
    return task


def _submit_wait_and_run(
    spec: Path, name: str, fleet: Any, server: str, token: str
) -> tuple[Any, int, str, str]:
    """`whalegen submit SPEC --wait`, the task bound to the whole GPU as a cycle would once it arrives
    (the agent must be registered); returns the task as it ended, the CLI's exit code, stdout, stderr."""
    from apps.workloads.models import Task

    cli = _cli(
        "submit", str(spec), "--wait", "--timeout", "60", "--interval", "0.3", server=server, token=token
    )
    try:
        task = wait_for(lambda: Task.objects.filter(name=name).first(), what="the submission")
        assign(task, fleet.node, [fleet.whole_unit])
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    task.refresh_from_db()
    return task, cli.returncode, out, err


def _cli(*args: str, server: str, token: str) -> subprocess.Popen[str]:
    env = dict(os.environ, WHALEGEN_URL=server, WHALEGEN_TOKEN=token, PYTHONPATH=str(ROOT))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.Popen(
        [sys.executable, "-m", "whalegen", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _follow_api(server: str, token: str, task_id: int, into: list[dict[str, Any]]) -> None:
    """What a pipeline does with the API: long-poll from next_offset until complete."""
    offset = 0
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        page = session.get(
            f"{server}/api/v1/tasks/{task_id}/logs/",
            params={"offset": offset, "follow": "true", "wait_s": 2, "limit": 3000},
            timeout=30,
        ).json()
        into.extend(page["lines"])
        offset = page["next_offset"]
        if page["complete"]:
            return


def test_ten_thousand_lines_followed_live_arrive_complete_and_in_order(
    fleet: Any, agents: Any, live_server: Any
) -> None:
    agent = agents(token=fleet.token_a, node_name="gpu-001", gpus=H100_NODE)
    agent.start()
    wait_for(lambda: _registered(fleet), what="registration")
    token = _token(fleet)
    task = _run(fleet.task_a, [sys.executable, "-c", PRINTER], fleet)
    via_api: list[dict[str, Any]] = []
    follower = threading.Thread(target=_follow_api, args=(live_server.url, token, task.pk, via_api))
    follower.start()
    cli = _cli("tasks", "logs", str(task.pk), "-f", server=live_server.url, token=token)
    # Followed while it runs: some output is there before the task ends.
    wait_for(lambda: len(via_api) > 0, timeout_s=30, what="the first lines through the API")
    task.refresh_from_db()
    seen_running = task.state == "running"
    out, err = cli.communicate(timeout=90)
    follower.join(timeout=90)
    task.refresh_from_db()
    assert task.state == "succeeded" and seen_running
    want_out = [f"out {i:05d}" for i in range(10000)]
    want_err = [f"err {i:05d}" for i in range(0, 10000, 2500)]
    assert cli.returncode == 0, err
    assert out.splitlines() == want_out
    assert err.splitlines() == want_err
    assert [line["n"] for line in via_api] == list(range(10004))  # every line once, in order
    assert [line["text"] for line in via_api if line["stream"] == "stdout"] == want_out
    assert [line["text"] for line in via_api if line["stream"] == "stderr"] == want_err
    # Each stderr line comes within one 4 KiB read of the stdout line printed just before it.
    for err_line in (line for line in via_api if line["stream"] == "stderr"):
        number = int(err_line["text"][4:])
        position = next(i for i, line in enumerate(via_api) if line["text"] == f"out {number:05d}")
        assert abs(via_api.index(err_line) - position) < 400


class Gate:
    """A TCP forwarder in front of the live server that can play a plane outage (refuse everything)."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def down(self) -> None:
        self.open = False
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
        self.conns = []

    def up(self) -> None:
        self.open = True

    def close(self) -> None:
        self.down()
        self.listener.close()


def test_output_written_while_the_plane_is_down_arrives_after_it_returns_once(
    fleet: Any, agents: Any, live_server: Any, shared_dir: Path
) -> None:
    from apps.logs.models import LogStream

    gate = Gate(live_server.url)
    try:
        agent = agents(token=fleet.token_a, node_name="gpu-001", gpus=H100_NODE)
        agent.server = gate.url
        agent.start()
        wait_for(lambda: _registered(fleet), what="registration")
        go = shared_dir / "go"  # the test makes it, the task waits for it
        script = (
            "import os, time\nprint('before the outage', flush=True)\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
            "for i in range(300): print(f'during {i}', flush=True)\n"
            "time.sleep(1.5)\nprint('after', flush=True)\n"
        )
        task = _run(fleet.task_a, [sys.executable, "-c", script], fleet)
        wait_for(lambda: LogStream.objects.filter(task=task, next_line__gte=1).exists(), what="first line")
        gate.down()
        go.touch()
        time.sleep(1.0)  # the lines are written while no report gets through
        assert LogStream.objects.get(task=task).next_line == 1
        gate.up()
        wait_for(lambda: _finished(task), timeout_s=40, what="the task to end after the outage")
    finally:
        gate.close()
    token = _token(fleet)
    page = requests.get(
        f"{live_server.url}/api/v1/tasks/{task.pk}/logs/",
        params={"limit": 1000},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ).json()
    want = ["before the outage", *(f"during {i}" for i in range(300)), "after"]
    assert [line["text"] for line in page["lines"]] == want and page["complete"] is True


def _finished(task: Any) -> bool:
    task.refresh_from_db()
    return task.state in ("succeeded", "failed")


def test_the_cap_keeps_the_head_and_the_tail_of_a_big_output(
    fleet: Any, agents: Any, live_server: Any
) -> None:
    agent = agents(token=fleet.token_a, node_name="gpu-001", gpus=H100_NODE)
    agent.env["WHALEGEN_AGENT_LOG_CAP_MIB"] = str(64 / 1024)  # 64 KiB: 32 KiB of head, 32 of tail
    agent.start()
    wait_for(lambda: _registered(fleet), what="registration")
    # 20,000 lines of about 40 bytes of record each: 800 KiB, far above the cap.
    printer = "for i in range(20000): print(f'line {i:05d}')"
    task = _run(fleet.task_a, [sys.executable, "-c", printer], fleet)
    wait_for(lambda: _finished(task), timeout_s=40, what="the task to end")
    token = _token(fleet)
    page = requests.get(
        f"{live_server.url}/api/v1/tasks/{task.pk}/logs/",
        params={"limit": 10000},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ).json()
    lines = page["lines"]
    texts = [line["text"] for line in lines if line["stream"] == "stdout"]
    gaps = [line for line in lines if line["stream"] == "dropped"]
    assert texts[0] == "line 00000" and texts[-1] == "line 19999"
    assert gaps and sum(gap["dropped_lines"] for gap in gaps) + len(texts) == 20000
    assert page["dropped_lines"] == sum(gap["dropped_lines"] for gap in gaps)
    assert len(texts) < 4000  # about 64 KiB of records kept, not 800
    assert page["complete"] is True


def test_a_command_that_cannot_start_fails_once_and_submit_wait_shows_why(
    fleet: Any, agents: Any, live_server: Any, tmp_path: Path
) -> None:
    agent = agents(token=fleet.token_a, node_name="gpu-001", gpus=H100_NODE)
    agent.start()
    token = _token(fleet)
    spec = tmp_path / "task.yaml"
    spec.write_text("queue: train\nname: no-such-command\ncommand: [no-such-command-here, --flag]\n")
    wait_for(lambda: _registered(fleet), what="registration")
    task, code, out, err = _submit_wait_and_run(spec, "no-such-command", fleet, live_server.url, token)
    assert (task.state, task.attempts, task.exit_code) == ("failed", 0, 127)
    assert code == 127, err
    words = "cannot run 'no-such-command-here': No such file or directory"
    assert f"[whalegen] {words}" in err  # the launcher's line, streamed
    assert f"whalegen: task {task.pk} failed: exit code 127: launch failed: {words}" in err
    assert out.splitlines()[-1] == f"task {task.pk}: failed exit code 127"
    assert not task.events.filter(to_state="lost").exists()


def test_the_command_starts_in_its_working_directory_and_a_bad_one_fails_with_why(
    fleet: Any, agents: Any, live_server: Any, tmp_path: Path, shared_dir: Path
) -> None:
    agent = agents(token=fleet.token_a, node_name="gpu-001", gpus=H100_NODE)
    agent.start()
    token = _token(fleet)
    workdir = shared_dir / "project"  # a working directory the task's uid reaches
    workdir.mkdir()
    (workdir / "data.txt").write_text("from the working directory\n")
    good = tmp_path / "good.yaml"
    good.write_text(f"queue: train\nname: in-dir\nworking_dir: {workdir}\ncommand: [cat, data.txt]\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"queue: train\nname: no-dir\nworking_dir: {shared_dir}/missing\ncommand: ['true']\n")
    wait_for(lambda: _registered(fleet), what="registration")
    task, code, out, err = _submit_wait_and_run(good, "in-dir", fleet, live_server.url, token)
    assert (task.state, code) == ("succeeded", 0), err
    assert "from the working directory" in out
    task, code, out, err = _submit_wait_and_run(bad, "no-dir", fleet, live_server.url, token)
    words = f"cannot change to working directory '{shared_dir}/missing': No such file or directory"
    assert (task.state, task.attempts, task.exit_code, code) == ("failed", 0, 126, 126)
    assert f"[whalegen] {words}" in err  # the launcher's line, streamed
    assert words in task.failure_reason
    show = _cli("tasks", "show", str(task.pk), server=live_server.url, token=token)
    shown, _ = show.communicate(timeout=30)
    assert f"working dir: {shared_dir}/missing" in shown
    (reason,) = [line for line in shown.splitlines() if line.strip().startswith("failure reason:")]
    assert "launch failed: " + words in reason
