"""Own PostgreSQL and Redis servers for the fault suite, on ports of their own, so that restarting them
never touches the machine's services. Each is a real server binary in a temporary directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Below Linux's ephemeral range (32768-60999): a port in it can be taken at any moment as the local end
# of an outgoing connection (the suite opens thousands), which is how a server of ours once failed to
# bind ("Address already in use") between the free-port check and its start.
REDIS_PORT = int(os.environ.get("WHALEGEN_FAULTS_REDIS_PORT", "16381"))
POSTGRES_PORT = int(os.environ.get("WHALEGEN_FAULTS_POSTGRES_PORT", "15434"))


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_port(port: int, *, open_: bool, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while _port_open(port) is not open_:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what}: port {port} still {'closed' if open_ else 'open'} after {timeout_s} s"
            )
        time.sleep(0.05)


class RedisServer:
    """`redis-server` on `port`, no persistence: a restart empties it, as a failover to a fresh replica
    would (the worst case for queued messages; WhaleGen's beat re-sends what is periodic)."""

    def __init__(self, work: Path, port: int = REDIS_PORT) -> None:
        self.work = work
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        work.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "the fault suite needs redis-server on PATH"
        assert not _port_open(self.port), f"port {self.port} is taken: another Redis runs there"
        with (self.work / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.work)],
                stdout=log, stderr=log,
            )  # fmt: skip
        _wait_port(self.port, open_=True, timeout_s=10, what="redis-server start")

    def stop(self, signum: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signum)
        self.proc.wait(timeout=20)
        _wait_port(self.port, open_=False, timeout_s=10, what="redis-server stop")

    def restart(self, signum: int, down_s: float = 1.0) -> None:
        self.stop(signum)
        time.sleep(down_s)
        self.start()


class PostgresServer:
    """A PostgreSQL cluster of its own (`initdb` into a temporary directory, trust auth, user postgres)."""

    def __init__(self, work: Path, port: int = POSTGRES_PORT) -> None:
        self.work = work
        self.port = port
        self.data = work / "data"
        self.bin = self._bin_dir()

    @staticmethod
    def _bin_dir() -> Path:
        candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), reverse=True)
        found = candidates[0].parent if candidates else None
        if found is None and shutil.which("pg_ctl"):
            found = Path(shutil.which("pg_ctl") or "").parent
        assert found is not None, "the fault suite needs PostgreSQL's initdb/pg_ctl"
        return found

    def url(self, name: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def _run(self, *args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, **self._as_owner())

    def _as_owner(self) -> dict[str, object]:
        # initdb refuses to run as root: run the cluster as the owner of the work directory instead.
        if os.geteuid() != 0:
            return {}
        import pwd

        user = pwd.getpwnam("postgres")
        return {"user": user.pw_uid, "group": user.pw_gid}

    def init(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.work, "postgres", "postgres")
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        conf = self.data / "postgresql.conf"
        with conf.open("a") as out:
            # Small and quick: this cluster lives for one test session on a loaded 2-core machine.
            out.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.work}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n"
                "shared_buffers = 64MB\n"
            )

    def start(self) -> None:
        assert not _port_open(self.port), f"port {self.port} is taken: another PostgreSQL runs there"
        log = self.work / "pg.log"
        start = (str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(log), "-w", "start")
        try:
            self._run(*start)
        except subprocess.CalledProcessError as first:
            # Seen in CI rehearsals: once the log went with the temporary directory; once the port was
            # taken as an outgoing connection's local port (the ports are now below the ephemeral range).
            # Say why (the server's log), then try once more before failing.
            why = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            print(f"pg_ctl start failed ({first.stderr!r}); server log:\n{why}", file=sys.stderr)
            self.stop("immediate")
            time.sleep(2.0)
            try:
                self._run(*start)
            except subprocess.CalledProcessError as second:
                why = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
                raise AssertionError(f"PostgreSQL did not start: {second.stderr!r}\n{why}") from second
        _wait_port(self.port, open_=True, timeout_s=30, what="postgres start")

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast", down_s: float = 1.0) -> None:
        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster: the database crashes and recovers on the next start."""
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
