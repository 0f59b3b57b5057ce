"""`whalegen agent join` on a host (issue #38, item 2): it describes the host as the backend sees it,
keeps the node credential owner-only in the state directory, does not spend a token twice, says the
plane's reason when refused, and `whalegen agent` then runs on the kept credential with no token given."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agents.join import CREDENTIAL_FILE, NodeCredential, credential_load, credential_save
from tests.agents.conftest import TOKEN
from tests.agents.plane_double import PlaneDouble
from whalegen.protocol import JOIN_PATH, Join, Joined

ROOT = Path(__file__).resolve().parents[2]
JOIN_TOKEN = "wgj_" + "j" * 43


class JoiningPlane(PlaneDouble):
    """The plane double with the join endpoint too: the right join token joins (and gets the credential
    the double knows as node "a"), anything else is refused with a sentence as the plane words it."""

    def __init__(self, *, pending_approval: bool = False) -> None:
        super().__init__({TOKEN: "a"}, heartbeat_interval_s=0.5, poll_wait_s=1.0)
        self.pending_approval = pending_approval
        self.joins: list[Join] = []

    def _handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        if not (method == "POST" and urlsplit(request.path).path == JOIN_PATH):
            return super()._handle(request, method)
        message = Join.from_dict(json.loads(request.rfile.read(int(request.headers["Content-Length"]))))
        with self.lock:
            self.joins.append(message)
        if message.join_token != JOIN_TOKEN:
            return self._send(
                request, 403, {"detail": "join token h100-abc123 has been used up (its one use)"}
            )
        joined = Joined(
            node_id="7",
            node_name=message.node_name,
            cluster="eu-1",
            pool=message.pool,
            credential=TOKEN,
            pending_approval=self.pending_approval,
        )
        return self._send(request, 201, joined.to_dict())


@pytest.fixture
def join_plane() -> Iterator[JoiningPlane]:
    double = JoiningPlane()
    double.start()
    yield double
    double.stop()


def agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WHALEGEN_AGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "whalegen", "agent", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**clean, "PYTHONPATH": str(ROOT), **(env or {})},
    )  # fmt: skip


def join_args(server: str, state: Path, *extra: str) -> list[str]:
    return ["join", "--server", server, "--join-token", JOIN_TOKEN, "--pool", "h100-train",
            "--name", "gpu-new", "--backend", "sim", "--state-dir", str(state), *extra]  # fmt: skip


def test_join_keeps_the_credential_owner_only_and_sends_the_hosts_own_gpus(
    join_plane: JoiningPlane, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    done = agent(*join_args(join_plane.url, state))
    assert done.returncode == 0, done.stderr
    assert "joined as node eu-1/gpu-new (id 7) in pool h100-train" in done.stdout
    path = state / CREDENTIAL_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o711
    kept = credential_load(state)
    assert kept is not None and (kept.credential, kept.server, kept.node_id) == (TOKEN, join_plane.url, "7")
    (message,) = join_plane.joins
    assert (message.pool, message.node_name, message.join_token) == ("h100-train", "gpu-new", JOIN_TOKEN)
    # What `whalegen agent inspect --backend sim` reads: the example host's GPUs, by model and UUID.
    inspected = json.loads(agent("inspect", "--backend", "sim").stdout)
    assert [(g.model, g.uuid) for g in message.inventory] == [
        (g["inventory"]["model"], g["inventory"]["uuid"]) for g in inspected["gpus"]
    ]
    assert message.cpu_milli >= 1000 and message.mem_mib > 0
    assert JOIN_TOKEN not in done.stdout + done.stderr


def test_joining_again_says_so_and_spends_nothing_unless_forced(
    join_plane: JoiningPlane, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    assert agent(*join_args(join_plane.url, state)).returncode == 0
    again = agent(*join_args(join_plane.url, state))
    assert again.returncode == 0
    assert "already joined as node eu-1/gpu-new" in again.stdout and "--force" in again.stdout
    assert len(join_plane.joins) == 1
    forced = agent(*join_args(join_plane.url, state, "--force"))
    assert forced.returncode == 0 and len(join_plane.joins) == 2


def test_a_refused_join_prints_the_planes_sentence_and_keeps_nothing(
    join_plane: JoiningPlane, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    args = join_args(join_plane.url, state)
    args[args.index("--join-token") + 1] = "wgj_spent"
    done = agent(*args)
    assert done.returncode == 77  # EX_NOPERM: the token is refused
    assert "refused: join token h100-abc123 has been used up (its one use)" in done.stderr
    assert not (state / CREDENTIAL_FILE).exists()


def test_join_needs_its_three_arguments_and_a_plane_that_answers(tmp_path: Path) -> None:
    missing = agent("join", "--backend", "sim", "--state-dir", str(tmp_path / "s"))
    assert missing.returncode == 2 and "--server, --join-token, --pool required" in missing.stderr
    away = agent(*join_args("http://127.0.0.1:9", tmp_path / "s"))
    assert away.returncode == 69 and "the plane did not answer" in away.stderr


def test_the_join_token_may_come_from_a_file(join_plane: JoiningPlane, tmp_path: Path) -> None:
    secret = tmp_path / "join-token"
    secret.write_text(JOIN_TOKEN + "\n")
    args = join_args(join_plane.url, tmp_path / "state")
    del args[args.index("--join-token") : args.index("--join-token") + 2]
    done = agent(*args, env={"WHALEGEN_AGENT_JOIN_TOKEN_FILE": str(secret)})
    assert done.returncode == 0, done.stderr
    assert join_plane.joins[0].join_token == JOIN_TOKEN


def test_an_unreadable_credential_file_counts_as_not_joined(tmp_path: Path) -> None:
    tmp_path.joinpath(CREDENTIAL_FILE).write_text("{not json")
    assert credential_load(tmp_path) is None
    credential = NodeCredential("wgn_x", "http://p", "1", "n", "c", "p", 0.0)
    credential_save(tmp_path, credential)
    assert credential_load(tmp_path) == credential


def _run_agent(state: Path, plane_url: str | None, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WHALEGEN_AGENT_")}
    server = ["--server", plane_url] if plane_url else []
    return subprocess.Popen(
        [sys.executable, "-m", "whalegen", "agent", *server, "--backend", "sim", "--state-dir", str(state),
         "--heartbeat-s", "0.5", "--poll-wait-s", "1", "--container-engine", "none", "--single-tenant"],
        cwd=ROOT, env={**clean, "PYTHONPATH": str(ROOT), **env},
        stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_the_agent_runs_on_the_joined_credential_with_no_token_or_server_given(
    join_plane: JoiningPlane, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    credential_save(state, NodeCredential(TOKEN, join_plane.url, "a", "gpu-new", "eu-1", "h100-train", 0.0))
    proc = _run_agent(state, None, {}, tmp_path / "agent.log")
    try:
        join_plane.wait_for(lambda: join_plane.heartbeats, timeout_s=30, what="a heartbeat")
        assert join_plane.registrations[0].node_name == "gpu-new"
    finally:
        _stop(proc)
    assert join_plane.joins == []


def test_the_agent_joins_first_when_it_holds_no_credential_but_a_join_token(
    join_plane: JoiningPlane, tmp_path: Path
) -> None:
    """What docker/compose.yaml's agent does: join if needed, then run; restarted, it joins no more."""
    state = tmp_path / "state"
    env = {"WHALEGEN_AGENT_JOIN_TOKEN": JOIN_TOKEN, "WHALEGEN_AGENT_POOL": "h100-train"}
    for _ in range(2):
        proc = _run_agent(state, join_plane.url, env, tmp_path / "agent.log")
        try:
            join_plane.wait_for(lambda: join_plane.heartbeats, timeout_s=30, what="a heartbeat")
        finally:
            _stop(proc)
        join_plane.heartbeats.clear()
    assert len(join_plane.joins) == 1
    assert stat.S_IMODE((state / CREDENTIAL_FILE).stat().st_mode) == 0o600
    # Its output, the join's lines included, is log lines (JSON by default) without the join token.
    lines = [json.loads(line) for line in (tmp_path / "agent.log").read_text().splitlines()]
    assert any(line["message"].startswith("whalegen agent join: joined as") for line in lines)
    assert {line["component"] for line in lines} == {"agent"}
    assert JOIN_TOKEN not in (tmp_path / "agent.log").read_text()
