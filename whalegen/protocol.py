"""Wire messages between a node agent and the control plane. Pure: stdlib only.

Conversation (all JSON over HTTP, `Authorization: Bearer <node token>`):

1. `POST REGISTER_PATH` with `Register` → `Registered` (node id, intervals). 401 on a bad token; 409
   when the agent's protocol major version is not the plane's.
2. `POST HEARTBEAT_PATH` with `Heartbeat` every `heartbeat_interval_s`: inventory, telemetry,
   processes, NVML events, lost GPUs → `HeartbeatAck`.
3. `GET DESIRED_STATE_PATH?generation=G&wait_s=W` long-polls: 200 with a `DesiredState` whose
   generation differs from G, or 204 after W seconds with nothing new.
4. `POST REPORT_PATH` with `Report` (task and partition state changes, numbered by `seq`) →
   `ReportAck` carrying the highest seq stored. Reports are idempotent by (node, seq): an agent that
   buffered them on disk through an outage resends them and the plane ignores repeats.

A node sees and changes only its own state: every path acts on the node the token belongs to.

Before the conversation, once per host: `POST JOIN_PATH` with `Join` (no Authorization header; the join
token an admin made rides in the body, with the host's own inventory) → `Joined`, which carries the new
node's credential, shown once. 401 for an unknown join token; 403 for one expired, revoked, used up or
made for another pool; 409 when the node name already has a live credential; 400 for a malformed host
description. Not a version change: an agent that never joins never calls it, and a plane without it
answers 404 (docs/agent.md, "Joining").
Messages ignore unknown fields so either side can add optional ones within a major version.

Versions: 1.0 first release. 1.1 adds `TaskSpec.attempt` and `TaskReport.attempt` (the run of a task:
0 first, n after the n-th requeue), `TaskSpec.gpu_uuids` (every GPU of a multi-GPU task, in order),
`Heartbeat.running` (the runs the agent supervises) and `ProcessSample.attempt`. A 1.1 plane talking to
a 1.0 agent (which ignores `attempt`) folds the attempt into the task id instead (`<task>.<n>`, see
`legacy_run_id`), which is what 1.0 did. 1.2 adds `Report.logs`: the captured output of runs in
ordered `LogChunk`s (line numbers per run, dropped-line counts at the cap, an end-of-output mark). They
ride the report's outbox and its (node, seq) idempotency; a 1.1 agent simply sends none, and a 1.1 plane
ignores the field (unknown fields are ignored). 1.3 adds `TaskSpec.working_dir`, the directory the
command starts in; an older agent would ignore it, so the plane wraps such a run's command in a shell
that enters the directory first (`in_directory`). 1.4 adds how a run is isolated on its host
(docs/isolation.md): `TaskSpec.runtime` (a container image through the host's container engine, or a
hardened process), `image` and `pull_policy`, the tenant and the unprivileged uid/gid the run takes,
and its host limits (`cpu_milli`, `host_mem_mib`, `pids_max`); `Registered.lease_s`, how long a run may
go on after the agent's last acknowledged heartbeat (the fence: a run is stopped on its node before
the plane could declare the node lost and run the work elsewhere). A 1.3 agent ignores them all and
runs the command as before; the plane refuses to send container runs to it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, TypeVar, Union, get_args, get_origin

PROTOCOL_VERSION = "1.4"  # major.minor: the major must match, minors only add optional fields

API_PREFIX = "/api/v1/agent"
REGISTER_PATH = f"{API_PREFIX}/register/"
HEARTBEAT_PATH = f"{API_PREFIX}/heartbeat/"
DESIRED_STATE_PATH = f"{API_PREFIX}/desired-state/"
REPORT_PATH = f"{API_PREFIX}/reports/"
# Outside the node's conversation: a new host trades a join token for its node credential (`Join`).
JOIN_PATH = f"{API_PREFIX}/join/"
TOKEN_HEADER = "Authorization"  # value: "Bearer <token>"


def protocol_major(version: str) -> int:
    return int(version.split(".", 1)[0])


def compatible(version: str) -> bool:
    return protocol_major(version) == protocol_major(PROTOCOL_VERSION)


def protocol_minor(version: str) -> int:
    _, _, minor = version.partition(".")
    return int(minor) if minor.isdigit() else 0


def speaks_attempts(version: str) -> bool:
    """True when a peer of `version` carries the attempt in its own field (1.1 on)."""
    return compatible(version) and protocol_minor(version) >= 1


def speaks_working_dir(version: str) -> bool:
    """True when a peer of `version` knows `TaskSpec.working_dir` (1.3 on)."""
    return compatible(version) and protocol_minor(version) >= 3


def speaks_isolation(version: str) -> bool:
    """True when a peer of `version` knows the 1.4 isolation fields (`TaskSpec.runtime` and the rest)."""
    return compatible(version) and protocol_minor(version) >= 4


def in_directory(working_dir: str, command: tuple[str, ...]) -> tuple[str, ...]:
    """`command`, started in `working_dir` by a shell: for agents older than 1.3, which would ignore the
    field and start the command in the wrong place. 126 when the directory cannot be entered, as the
    1.3 launcher does."""
    enter = 'cd -- "$1" || { echo "cannot change to working directory $1" >&2; exit 126; }; shift; exec "$@"'
    return ("sh", "-c", enter, "sh", working_dir, *command)


def legacy_run_id(task_id: str, attempt: int) -> str:
    """How protocol 1.0 named a run: the task id for attempt 0, `<task>.<n>` for attempt n."""
    return task_id if attempt == 0 else f"{task_id}.{attempt}"


def run_of(task_id: str, attempt: int) -> tuple[str, int]:
    """(task id, attempt) of a run named either way: a 1.0 `<task>.<n>` id wins over `attempt`."""
    head, dot, tail = task_id.rpartition(".")
    if dot and head and tail.isdigit():
        return head, int(tail)
    return task_id, attempt


def run_key(task_id: str, attempt: int) -> str:
    """The agent's local name of one run (state file, task directory): unique per (task, attempt)."""
    return task_id if attempt == 0 else f"{task_id}#{attempt}"


class ProtocolError(ValueError):
    pass


T = TypeVar("T", bound="Message")


def _encode(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, LogChunk):
        return value.wire()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    return value


def _decode(tp: Any, value: Any, where: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return _decode(inner[0], value, where)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ProtocolError(f"{where}: expected a list")
        item_type = get_args(tp)[0]
        return tuple(_decode(item_type, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object")
        _, value_type = get_args(tp)
        return {str(k): _decode(value_type, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, Message):
        return tp.from_dict(value, where)
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            raise ProtocolError(f"{where}: {value!r} is not one of {[e.value for e in tp]}") from None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{where}: expected a number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where}: expected an integer")
        return value
    if tp in (str, bool) and not isinstance(value, tp):
        raise ProtocolError(f"{where}: expected {tp.__name__}")
    return value


class Message:
    """Frozen dataclass messages with `to_dict()` / `from_dict()`; unknown keys are ignored."""

    def to_dict(self) -> dict[str, Any]:
        encoded = _encode(self)
        assert isinstance(encoded, dict)
        return encoded

    @classmethod
    def from_dict(cls: type[T], data: Any, where: str = "") -> T:
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise ProtocolError(f"{where}: expected an object")
        kwargs: dict[str, Any] = {}
        for name, hint, required in _schema(cls):  # type: ignore[arg-type]
            if name in data:
                kwargs[name] = _decode(hint, data[name], f"{where}.{name}")
            elif required:
                raise ProtocolError(f"{where}: missing {name}")
        return cls(**kwargs)


@functools.cache
def _schema(cls: type[Message]) -> tuple[tuple[str, Any, bool], ...]:
    """(field, type, required) of a message class, worked out once: `typing.get_type_hints` is slow,
    and a report carries thousands of output lines."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    )


# ---- what the agent observes ----------------------------------------------------------------------
@dataclass(frozen=True)
class NvmlFailure(Message):
    """An NVML error as data: the operation, the GPU, NVML's numeric code and its name."""

    op: str
    code: int
    name: str
    gpu_uuid: str = ""
    detail: str = ""


@dataclass(frozen=True)
class MigInstance(Message):
    """One GPU instance with its (default, whole-GI) compute instance, as found on the GPU."""

    gi_id: int
    profile_id: int
    profile: str  # e.g. "3g.40gb"
    start: int  # memory slice
    size: int  # memory slices
    ci_id: int | None = None
    mig_uuid: str | None = None  # what CUDA_VISIBLE_DEVICES takes
    mem_mib: int = 0
    busy_pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuInventory(Message):
    index: int
    uuid: str
    name: str  # NVML device name
    model: str | None  # catalogue model name, None when unknown
    mem_mib: int
    pci_bus_id: str
    mig_capable: bool
    mig_current: bool = False
    mig_pending: bool = False
    lost: bool = False
    instances: tuple[MigInstance, ...] = ()


@dataclass(frozen=True)
class TelemetrySample(Message):
    gpu_uuid: str
    at_s: float  # agent wall clock, seconds since the epoch
    mem_used_mib: int | None
    mem_total_mib: int | None
    util_gpu_pct: int | None  # None where NVML says NOT_SUPPORTED (MIG mode)
    util_mem_pct: int | None
    power_w: float | None
    power_limit_w: float | None
    temperature_c: int | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    ecc_uncorrected_aggregate: int | None
    not_supported: tuple[str, ...] = ()  # the metrics NVML does not offer here, e.g. "utilization"


@dataclass(frozen=True)
class ProcessSample(Message):
    pid: int
    gpu_uuid: str
    device_uuid: str  # the GPU's or the MIG device's UUID
    used_mib: int | None
    mps: bool = False
    task_id: str | None = None
    attempt: int = 0  # 1.1


@dataclass(frozen=True)
class GpuEvent(Message):
    gpu_uuid: str
    kind: str  # "xid", "ecc_single", "ecc_double", "mig_config_change"
    at_s: float
    xid: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    fatal: bool = False  # Xid 79 / GPU_IS_LOST: the GPU left the inventory


# ---- register and heartbeat --------------------------------------------------------------------------
@dataclass(frozen=True)
class Register(Message):
    node_name: str
    hostname: str
    agent_version: str
    protocol_version: str = PROTOCOL_VERSION
    inventory: tuple[GpuInventory, ...] = ()


@dataclass(frozen=True)
class Registered(Message):
    node_id: str
    heartbeat_interval_s: float = 10.0
    poll_wait_s: float = 20.0
    protocol_version: str = PROTOCOL_VERSION
    # The highest report seq the plane holds for this node (optional, 0 from planes that do not send
    # it). An agent numbering at or below it lost its state: it continues above, or its reports would
    # be taken for repeats and dropped.
    stored_seq: int = 0
    # 1.4: a run may go on this long after the send time of the agent's last acknowledged heartbeat;
    # then its launcher stops it (0: no fence, planes before 1.4). Shorter than the plane's loss
    # threshold by the stop grace and a margin, so the run is gone before its work is placed elsewhere.
    lease_s: float = 0.0


@dataclass(frozen=True)
class Join(Message):
    """A host asks to become a node of `pool`, describing itself as NVML sees it (`GpuBackend.inventory`,
    what `whalegen agent inspect` reads): the plane creates the node and its GPUs from this, never from
    what a person typed."""

    join_token: str
    pool: str
    node_name: str
    hostname: str
    agent_version: str
    cpu_milli: int  # the host's CPUs, thousandths of a core
    mem_mib: int  # the host's memory
    protocol_version: str = PROTOCOL_VERSION
    driver_version: str = ""
    inventory: tuple[GpuInventory, ...] = ()


@dataclass(frozen=True)
class Joined(Message):
    """The node the host now is, and its credential: the plane keeps only the credential's hash."""

    node_id: str
    node_name: str
    cluster: str
    pool: str
    credential: str
    # The pool's admin must approve the node first: until then it heartbeats but is given no work.
    pending_approval: bool = False


@dataclass(frozen=True)
class RunningTask(Message):
    """One run the agent is supervising (started or re-adopted, not yet ended)."""

    task_id: str
    attempt: int = 0
    pid: int | None = None


@dataclass(frozen=True)
class Heartbeat(Message):
    node_id: str
    agent_version: str
    sent_at_s: float
    protocol_version: str = PROTOCOL_VERSION
    inventory: tuple[GpuInventory, ...] = ()
    telemetry: tuple[TelemetrySample, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    events: tuple[GpuEvent, ...] = ()
    lost_gpus: tuple[str, ...] = ()
    generation_applied: int = 0
    # 1.1: every run the agent supervises. None (a 1.0 agent) means "not told", not "none running":
    # the plane only concludes a run was dropped from a list that was sent.
    running: tuple[RunningTask, ...] | None = None


@dataclass(frozen=True)
class HeartbeatAck(Message):
    generation: int = 0  # the plane's current desired-state generation: a hint to poll now


# ---- desired state ------------------------------------------------------------------------------------
class PartitionMode(StrEnum):
    WHOLE = "whole"
    MIG = "mig"
    MPS = "mps"
    TIMESLICE = "timeslice"


class UnitKind(StrEnum):
    WHOLE = "whole"
    MIG = "mig"
    MPS = "mps"
    TIMESLICE = "timeslice"


@dataclass(frozen=True)
class MigInstanceSpec(Message):
    profile: str  # profile name on this GPU's model, e.g. "1g.18gb"
    start: int | None = None  # pinned memory slice; None lets the agent plan it


@dataclass(frozen=True)
class MpsSpec(Message):
    default_thread_pct: int = 100
    default_pinned_mem_mib: int | None = None


@dataclass(frozen=True)
class GpuLayout(Message):
    gpu_uuid: str
    mode: PartitionMode = PartitionMode.WHOLE
    instances: tuple[MigInstanceSpec, ...] = ()  # mode MIG: the wanted GPU instances
    mps: MpsSpec | None = None  # mode MPS


@dataclass(frozen=True)
class ComputeUnit(Message):
    kind: UnitKind
    mig_profile: str | None = None  # MIG: which instance on the GPU (profile + start)
    mig_start: int | None = None
    thread_pct: int | None = None  # MPS: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    pinned_mem_mib: int | None = None  # MPS: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
    mem_limit_mib: int | None = None  # time slice: the watchdog's bound on the task's GPU memory


class TaskRuntime(StrEnum):
    """How a run is isolated on its host (1.4; docs/isolation.md)."""

    CONTAINER = "container"  # an OCI image run by the host's container engine (podman)
    PROCESS = "process"  # a command of the host, started as the tenant's uid in a sandbox


class PullPolicy(StrEnum):
    ALWAYS = "always"
    MISSING = "missing"  # pull only when the host does not have the image
    NEVER = "never"  # the image must already be on the host


class DesiredTaskState(StrEnum):
    RUN = "run"
    STOP = "stop"


@dataclass(frozen=True)
class TaskSpec(Message):
    task_id: str
    command: tuple[str, ...]
    gpu_uuid: str
    unit: ComputeUnit
    env: dict[str, str] = field(default_factory=dict)
    max_runtime_s: float | None = None
    desired: DesiredTaskState = DesiredTaskState.RUN
    stop_grace_s: float = 10.0
    attempt: int = 0  # 1.1: which run of the task this is; a new attempt is a new run to the agent
    gpu_uuids: tuple[str, ...] = ()  # 1.1: all the task's GPUs in order (gpu_uuid is the first)
    # 1.3: the directory the command starts in (inside the image for a container run); "" = the run's
    # own directory on the agent (a process run) or the image's working directory (a container run).
    working_dir: str = ""
    # 1.4: isolation (docs/isolation.md). A 1.3 plane sends none of these: the agent then runs the
    # command as a process of `tenant` "" (which a multi-tenant host refuses).
    runtime: TaskRuntime = TaskRuntime.PROCESS
    image: str = ""  # container runs: the OCI image reference; `command` is the argv inside it
    pull_policy: PullPolicy = PullPolicy.MISSING
    tenant: str = ""  # the tenant's name: who the run belongs to
    run_as_uid: int | None = None  # the unprivileged uid/gid the plane maps the tenant to
    run_as_gid: int | None = None
    cpu_milli: int | None = None  # host CPU, thousandths of a core (cgroup CPU quota)
    host_mem_mib: int | None = None  # host memory (cgroup memory limit; above it the run is killed)
    pids_max: int | None = None  # processes and threads the run may hold at once

    @property
    def devices(self) -> tuple[str, ...]:
        """The task's GPUs in order; a 1.0 plane names only `gpu_uuid`."""
        return self.gpu_uuids or (self.gpu_uuid,)


@dataclass(frozen=True)
class DesiredState(Message):
    generation: int
    gpus: tuple[GpuLayout, ...] = ()
    tasks: tuple[TaskSpec, ...] = ()
    allow_mig_mode_change: bool = False  # the plane's consent; the node's own config must allow it too


# ---- reports --------------------------------------------------------------------------------------------
class TaskState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # stopped on request or by a limit (see reason)
    LOST = "lost"  # the agent cannot tell what became of it (e.g. pid gone after a restart)
    REJECTED = "rejected"  # never started: its compute unit does not exist or is unusable


class PartitionState(StrEnum):
    OK = "ok"
    BLOCKED = "blocked"  # busy instances stand in the way; nothing was killed
    NEEDS_DRAIN = "needs_drain"
    INFEASIBLE = "infeasible"  # no layout satisfies the geometry
    MODE_CHANGE_NOT_ALLOWED = "mode_change_not_allowed"
    PENDING_RESET = "pending_reset"
    REBOOT_REQUIRED = "reboot_required"
    GPU_LOST = "gpu_lost"
    ERROR = "error"


@dataclass(frozen=True)
class TaskReport(Message):
    task_id: str
    state: TaskState
    at_s: float
    reason: str = ""
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    device_uuid: str | None = None
    started_at_s: float | None = None
    finished_at_s: float | None = None
    attempt: int = 0  # 1.1: the run reported on (TaskSpec.attempt)


@dataclass(frozen=True)
class PartitionReport(Message):
    gpu_uuid: str
    state: PartitionState
    at_s: float
    generation: int
    instances: tuple[MigInstance, ...] = ()
    actions: tuple[str, ...] = ()  # mutating NVML calls made, e.g. "create_gi 9@4 → gi 2"
    errors: tuple[NvmlFailure, ...] = ()
    reason: str = ""


class LogStreamName(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"
    LAUNCHER = "launcher"  # the launcher's own words: a command that cannot start, how the run ended


@dataclass(frozen=True)
class LogLine(Message):
    at_s: float  # agent wall clock when the launcher read the line
    stream: LogStreamName
    text: str  # without its newline; `partial` when the process wrote none (yet)
    partial: bool = False


@dataclass(frozen=True)
class LogChunk(Message):
    """Consecutive captured lines of one run, `first_line` the number (0-based) of its first line in
    the run's output. The plane stores a chunk once per (run, first_line), so a resent chunk is a
    no-op. `dropped_lines`/`dropped_bytes`: output the cap dropped just before this chunk (the middle
    of a run that printed more than the cap: its head and tail are kept). `eof`: nothing follows.

    On the wire each line is an array `[at_s, stream, text, partial]`, not an object: a chunk carries
    thousands of lines, and the generic object codec costs tens of microseconds a line."""

    task_id: str
    attempt: int
    first_line: int
    lines: tuple[LogLine, ...] = ()
    dropped_lines: int = 0
    dropped_bytes: int = 0
    eof: bool = False

    def wire(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "attempt": self.attempt,
            "first_line": self.first_line,
            "lines": [[line.at_s, line.stream.value, line.text, line.partial] for line in self.lines],
            "dropped_lines": self.dropped_lines,
            "dropped_bytes": self.dropped_bytes,
            "eof": self.eof,
        }

    def to_dict(self) -> dict[str, Any]:
        return self.wire()

    @classmethod
    def from_dict(cls, data: Any, where: str = "") -> LogChunk:
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise ProtocolError(f"{where}: expected an object")
        raw = data.get("lines", [])
        if not isinstance(raw, list):
            raise ProtocolError(f"{where}.lines: expected a list")
        lines = tuple(_log_line(item, f"{where}.lines[{i}]") for i, item in enumerate(raw))
        head = super().from_dict({k: v for k, v in data.items() if k != "lines"}, where)
        return dataclasses.replace(head, lines=lines)


_STREAMS = {stream.value: stream for stream in LogStreamName}


def _log_line(item: Any, where: str) -> LogLine:
    if not isinstance(item, list) or len(item) != 4:
        raise ProtocolError(f"{where}: expected [at_s, stream, text, partial]")
    at_s, stream, text, partial = item
    if isinstance(at_s, bool) or not isinstance(at_s, int | float):
        raise ProtocolError(f"{where}: at_s must be a number")
    if stream not in _STREAMS:
        raise ProtocolError(f"{where}: {stream!r} is not one of {sorted(_STREAMS)}")
    if not isinstance(text, str) or not isinstance(partial, bool):
        raise ProtocolError(f"{where}: text must be a string and partial a boolean")
    return LogLine(float(at_s), _STREAMS[stream], text, partial)


@dataclass(frozen=True)
class Report(Message):
    node_id: str
    seq: int
    sent_at_s: float
    tasks: tuple[TaskReport, ...] = ()
    partitions: tuple[PartitionReport, ...] = ()
    protocol_version: str = PROTOCOL_VERSION
    logs: tuple[LogChunk, ...] = ()  # 1.2


@dataclass(frozen=True)
class ReportAck(Message):
    stored_seq: int


# ---- wire checks: what the plane cannot store although it decodes -----------------------------------
INT64_MAX = 2**63 - 1  # the plane's integer columns (a report's `seq`, a generation) are 64-bit
_VERSION = re.compile(r"\d{1,9}(\.[0-9A-Za-z.+-]*)?")


def wire_problem(data: Any, message: Message | None = None) -> str | None:
    """What the plane could not store or compare although `message` decoded from `data` (the JSON as
    received): an integer beyond the 64-bit columns anywhere in `data`, a report's negative `seq`, or a
    protocol version without a numeric major. None when there is nothing."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{where}.{key}" if where else str(key), value) for key, value in item.items())
        elif isinstance(item, list):
            stack.extend((f"{where}[{index}]", value) for index, value in enumerate(item))
        elif isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX - 1 <= item <= INT64_MAX:
            return f"{where}: {item} is outside the 64-bit range the plane stores"
    if isinstance(message, Report) and message.seq < 0:
        return f"seq {message.seq} is negative"
    version = getattr(message, "protocol_version", None)
    if isinstance(version, str) and not _VERSION.fullmatch(version):
        return f"protocol_version {version[:40]!r} is not MAJOR.MINOR (e.g. {PROTOCOL_VERSION!r})"
    return None


def decode_checked(kind: type[T], data: Any) -> T:
    """`kind.from_dict(data)`, refusing also what `wire_problem` finds: ProtocolError either way, its
    text the answer a plane gives the agent (400)."""
    message = kind.from_dict(data)
    problem = wire_problem(data, message)
    if problem is not None:
        raise ProtocolError(f"{kind.__name__}: {problem}")
    return message
