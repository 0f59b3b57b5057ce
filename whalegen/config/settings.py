"""Django settings, read from the environment only (see README "Configuration").

With nothing set, WhaleGen runs on its embedded default: an SQLite file under WHALEGEN_DATA_DIR and an
in-process Celery (tasks run eagerly). Production sets DATABASE_URL (PostgreSQL) and REDIS_URL.
"""

from __future__ import annotations

from pathlib import Path

from whalegen.config.env import (
    ConfigError,
    database_from_url,
    envbool,
    envfloat,
    envint,
    envlist,
    envprices,
    envstr,
)
from whalegen.config.logging import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent.parent
DATA_DIR = Path(envstr("WHALEGEN_DATA_DIR", str(BASE_DIR / "var")) or "var")

DEBUG = envbool("WHALEGEN_DEBUG", False)
# Without a database URL we are on the embedded default (demo); debug-grade conveniences are fine there.
EMBEDDED = envstr("DATABASE_URL") is None

_secret = envstr("SECRET_KEY")
if _secret is None:
    if not (DEBUG or EMBEDDED):
        raise ConfigError("SECRET_KEY is required unless WHALEGEN_DEBUG=true or running embedded")
    # A per-installation key for the embedded default, kept in the data dir so sessions survive
    # restarts; never a constant in the source.
    _key_file = DATA_DIR / "secret_key"
    if _key_file.exists():
        _secret = _key_file.read_text().strip()
    else:
        import secrets

        DATA_DIR.mkdir(parents=True, exist_ok=True)
        _secret = secrets.token_urlsafe(50)
        _key_file.write_text(_secret)
SECRET_KEY = _secret

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
# Behind a TLS-terminating proxy (docs/operations.md, "TLS in front"): trust its X-Forwarded-Proto so
# Django knows the request was HTTPS, and send session and CSRF cookies over HTTPS only. Only behind a
# proxy that sets (or strips) that header itself; a client could forge it otherwise.
if envbool("WHALEGEN_SECURE_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's assets, served from here (no CDN)
    "apps.tenants",
    "apps.inventory",
    "apps.workloads",
    "apps.approvals",
    "apps.scheduling",
    "apps.forecasting",
    "apps.fleet",
    "apps.logs",
    "apps.accounting",
    "apps.declarative",
    "apps.metrics",
    "apps.periodic",
    "apps.dashboard",
]

MIDDLEWARE = [
    "apps.metrics.middleware.RequestIdMiddleware",  # first: every later log line knows its request
    "django.middleware.security.SecurityMiddleware",
    # Under /api/: a body above the upload limit is a 413 before it is read; Django's own error pages
    # (404 for an unmatched URL, 400, 500) are answered in the API's JSON error shape.
    "apps.common.exceptions.ApiErrorMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "whalegen.config.urls"
WSGI_APPLICATION = "whalegen.config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_database_url = envstr("DATABASE_URL", f"sqlite:///{DATA_DIR / 'whalegen.sqlite3'}")
assert _database_url is not None
DATABASES = {"default": database_from_url(_database_url)}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    Path(str(DATABASES["default"]["NAME"])).parent.mkdir(parents=True, exist_ok=True)
    # The embedded default serves agents, cycles and the API at once: a transaction takes the write lock
    # when it begins and waits for it (up to 20 s) instead of failing "database is locked" mid-way, and
    # the process's writers queue in arrival order before asking SQLite (whalegen/config/sqlite/base.py).
    DATABASES["default"]["ENGINE"] = "whalegen.config.sqlite"
    DATABASES["default"].setdefault("OPTIONS", {}).update({"transaction_mode": "IMMEDIATE", "timeout": 20})
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = envstr("TIME_ZONE", "UTC") or "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# The dashboard adds its assets there; until it exists, a missing directory is not an error.
STATICFILES_DIRS = [d for d in [BASE_DIR / "frontend" / "static"] if d.is_dir()]
# gunicorn serves no static files: where `collectstatic` has filled STATIC_ROOT (the Docker image),
# WhiteNoise serves the admin's and the API docs' files from it. The demo and tests collect nothing and
# serve static files through Django's own handler, so they run without it.
if STATIC_ROOT.is_dir():
    MIDDLEWARE.insert(1, "whitenoise.middleware.WhiteNoiseMiddleware")

LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:overview"
LOGOUT_REDIRECT_URL = "dashboard:login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.tenants.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "apps.common.pagination.CheckedLimitOffsetPagination",
    "PAGE_SIZE": envint("WHALEGEN_API_PAGE_SIZE", 50),
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "apps.common.schema.WhaleGenAutoSchema",
    "EXCEPTION_HANDLER": "apps.common.exceptions.exception_handler",
    # JSON in, JSON out: a form-encoded body is a 415 (it used to create a task with `command: []`),
    # and every answer is JSON whatever the client's Accept header says.
    "DEFAULT_PARSER_CLASSES": ["apps.common.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "apps.common.negotiation.JsonFirstContentNegotiation",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "WhaleGen API",
    "DESCRIPTION": "Submit, inspect and cancel GPU tasks; read pools, quotas and usage.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from drf-spectacular-sidecar's static files: /api/docs/ works without internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Operation ids read `tasks_list`, not `v1_tasks_list`.
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # Several models have a `state` / `kind`; name each enum after its owner.
    "ENUM_NAME_OVERRIDES": {
        "TaskStateEnum": "apps.workloads.models.Task.State",
        "TaskKindEnum": "apps.workloads.models.Task.Kind",
        "NodeStateEnum": "apps.inventory.models.Node.State",
        "ComputeUnitKindEnum": "apps.inventory.models.ComputeUnit.Kind",
        "GpuPartitionModeEnum": "apps.inventory.models.Gpu.PartitionMode",
        "TenantKindEnum": "apps.tenants.models.Tenant.Kind",
        "OverrideStateEnum": "apps.approvals.models.PriorityOverride.State",
    },
}

# Celery: Redis when configured, otherwise tasks run in-process (eagerly) for the embedded default.
REDIS_URL = envstr("REDIS_URL")
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = envstr("CELERY_RESULT_BACKEND", REDIS_URL)
CELERY_TASK_ALWAYS_EAGER = CELERY_BROKER_URL is None
if CELERY_BROKER_URL is None:
    # With a host named: kombu warns "No hostname was supplied" at every start-up for a bare memory://.
    CELERY_BROKER_URL = "memory://localhost/"
    CELERY_RESULT_BACKEND = "cache+memory://"
# Late acks: a message is acknowledged when its task ends, so a worker that dies mid-task hands it back.
# Redis hands back what is unacknowledged after the broker's visibility timeout even while its task still
# runs, so every task has a hard time limit and the visibility timeout is set above it, together, in
# whalegen/config/celery.py (WHALEGEN_TASK_TIME_LIMIT_S; docs/operations.md, "Scaling workers").
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
# Periodic work: `celery beat` on two or more hosts, one sending (the holder of a PostgreSQL lease) and
# the others standing by; the schedule's state is in PostgreSQL, not in a file (apps/periodic).
CELERY_BEAT_SCHEDULER = "apps.periodic.scheduler:LeaderScheduler"
WHALEGEN_CYCLE_INTERVAL_S = envfloat("WHALEGEN_CYCLE_INTERVAL_S", 5.0)
# The lease's TTL: a leader silent this long (hung, its host gone) loses it; a killed leader's lease is
# free at once, and a standby tries every quarter lease. Default: 1.5 cycle intervals, at least 5 s, so a
# vanished leader is replaced within two cycle intervals at the default 5 s.
WHALEGEN_BEAT_LEASE_S = envfloat("WHALEGEN_BEAT_LEASE_S", max(1.5 * WHALEGEN_CYCLE_INTERVAL_S, 5.0))
# Cycles have a queue of their own (`cycles`, routed in whalegen/config/celery.py), so a backlog of other
# work never delays them.
# A pool's cycle message older than an interval is stale (the next fan-out sent a fresh one): expired.
CELERY_TASK_ANNOTATIONS = {"apps.scheduling.tasks.cycle_pool": {"expires": WHALEGEN_CYCLE_INTERVAL_S}}


def _every(task: str, interval_s: float) -> dict[str, object]:
    """A beat entry sent every `interval_s`, its message expiring after one interval: a backlog (workers
    down, the broker back after an outage) runs the next send, never a pile of stale ones."""
    return {"task": task, "schedule": interval_s, "options": {"expires": interval_s}}


CELERY_BEAT_SCHEDULE = {
    "expire-overrides": _every(
        "apps.approvals.tasks.overrides_expire", float(envint("WHALEGEN_OVERRIDE_EXPIRY_INTERVAL_S", 60))
    ),
    # Retrain the forecasters (a candidate is promoted only when it beats the baselines and the active
    # model) and refresh the task profiles from finished runs.
    "forecasting-train": _every(
        "apps.forecasting.tasks.forecasting_train_all",
        float(envint("WHALEGEN_FORECAST_TRAIN_INTERVAL_S", 86_400)),
    ),
    "forecasting-memory-bounds": _every(
        "apps.forecasting.tasks.memory_bounds_refresh", float(envint("WHALEGEN_MEMORY_BOUND_INTERVAL_S", 600))
    ),
    "forecasting-profiles": _every(
        "apps.forecasting.tasks.profiles_refresh",
        float(envint("WHALEGEN_PROFILES_REFRESH_INTERVAL_S", 3_600)),
    ),
    # One scheduling cycle per pool every interval; a cycle that finds its pool busy just leaves.
    "schedule-pools": _every("apps.scheduling.tasks.cycles_all_pools", WHALEGEN_CYCLE_INTERVAL_S),
    # Nodes whose agent missed WHALEGEN_NODE_LOST_HEARTBEATS heartbeats are marked lost, tasks requeued.
    "fleet-node-health": _every(
        "apps.fleet.tasks.nodes_check_health", envfloat("WHALEGEN_NODE_HEALTH_INTERVAL_S", 5.0)
    ),
    # Run output of tasks that ended more than WHALEGEN_LOG_RETENTION_DAYS ago is deleted.
    "logs-expire": _every(
        "apps.logs.tasks.logs_expire", envfloat("WHALEGEN_LOG_RETENTION_INTERVAL_S", 3_600.0)
    ),
    # Running tasks whose GPUs idle are flagged, their owners told, and reclaimed where the queue says.
    "idle-reclaim": _every(
        "apps.fleet.tasks.idle_check_all_pools", envfloat("WHALEGEN_IDLE_CHECK_INTERVAL_S", 60.0)
    ),
    # A cheap stamp a worker writes for beat; `/readyz` reads its age as "beat seen recently".
    "plane-tick": _every("apps.metrics.tasks.plane_tick", envfloat("WHALEGEN_PLANE_TICK_INTERVAL_S", 15.0)),
}

# WhaleGen's own knobs.
WHALEGEN_TOKEN_TTL_DAYS = envint("WHALEGEN_TOKEN_TTL_DAYS", 90)
# How long a web process remembers a bearer token it has checked, with the caller's access (0: never).
# A revocation, membership change or deactivation made in another process takes effect within it.
WHALEGEN_AUTH_CACHE_S = envfloat("WHALEGEN_AUTH_CACHE_S", 5.0)
WHALEGEN_OVERRIDE_TTL_HOURS = envint("WHALEGEN_OVERRIDE_TTL_HOURS", 24)
# Accounting: price per GPU-hour by GPU model ("H100-80GB=2.50,A100-80GB=1.40"), in WHALEGEN_CURRENCY.
WHALEGEN_GPU_PRICES = envprices("WHALEGEN_GPU_PRICES")
WHALEGEN_CURRENCY = envstr("WHALEGEN_CURRENCY", "USD") or "USD"
# Forecasting: how far back finished runs and submissions feed training, baselines and profiles, and
# how many recent runs a prediction at submission reads for its key history.
WHALEGEN_FORECAST_LOOKBACK_DAYS = envint("WHALEGEN_FORECAST_LOOKBACK_DAYS", 30)
WHALEGEN_FORECAST_HISTORY_ROWS = envint("WHALEGEN_FORECAST_HISTORY_ROWS", 5_000)
# Attach forecasts in the submitting process instead of on a worker: the default without a broker.
WHALEGEN_FORECAST_INLINE = envbool("WHALEGEN_FORECAST_INLINE", CELERY_TASK_ALWAYS_EAGER)
# A candidate replaces the active model only when it is this much better (0.02 = 2 %) on the same
# validation runs: two models of equal skill must not swap on noise.
WHALEGEN_FORECAST_MIN_GAIN = envfloat("WHALEGEN_FORECAST_MIN_GAIN", 0.02)
# Safety margin of right-sizing advice above a profile's observed GPU memory peak (0.15 = 15 %).
WHALEGEN_RIGHT_SIZE_MARGIN = envfloat("WHALEGEN_RIGHT_SIZE_MARGIN", 0.15)
# Telemetry rows (task × GPU × instant) a profile refresh reads per key, and the memory-peak model
# reads in all (the latest ones): bounds the work of a refresh or a training run.
WHALEGEN_PROFILE_SAMPLE_ROWS = envint("WHALEGEN_PROFILE_SAMPLE_ROWS", 20_000)
WHALEGEN_MEMORY_SAMPLE_ROWS = envint("WHALEGEN_MEMORY_SAMPLE_ROWS", 500_000)
# Placement policy of production cycles: whalegen, fgd, bestfit or k8s-default (whalegen.placement.registry).
WHALEGEN_CYCLE_POLICY = envstr("WHALEGEN_CYCLE_POLICY", "whalegen") or "whalegen"
# WHALEGEN_CYCLE_INTERVAL_S: with the beat schedule above.
# Milli-GPUs of every pool kept idle for online-SLA tasks: a batch task may not take the last of them.
WHALEGEN_ONLINE_RESERVE_MILLI = envint("WHALEGEN_ONLINE_RESERVE_MILLI", 0)
# How the reserve is sized per pool and cycle: `static` (WHALEGEN_ONLINE_RESERVE_MILLI alone) or `forecast`
# (a Poisson quantile of the pool's online arrivals over the next hour, with the static value as its floor
# and at most WHALEGEN_ONLINE_RESERVE_MAX_SHARE of the pool's GPUs; whalegen.forecast.online_reserve).
WHALEGEN_ONLINE_RESERVE = envstr("WHALEGEN_ONLINE_RESERVE", "static") or "static"
if WHALEGEN_ONLINE_RESERVE not in ("static", "forecast"):
    raise ConfigError(f"WHALEGEN_ONLINE_RESERVE must be static or forecast, not {WHALEGEN_ONLINE_RESERVE!r}")
WHALEGEN_ONLINE_RESERVE_QUANTILE = envfloat("WHALEGEN_ONLINE_RESERVE_QUANTILE", 0.9)
WHALEGEN_ONLINE_RESERVE_MAX_SHARE = envfloat("WHALEGEN_ONLINE_RESERVE_MAX_SHARE", 0.5)
# A GPU a cycle re-carved for a task is held for it this long; unapplied by then, the claim is given up.
WHALEGEN_REPARTITION_TIMEOUT_S = envfloat("WHALEGEN_REPARTITION_TIMEOUT_S", 300.0)
# An agent that keeps reporting the GPU applied with other instances than planned (three long polls of
# 20 s): the claim is given up then, not at the timeout above.
WHALEGEN_REPARTITION_OTHER_LAYOUT_S = envfloat("WHALEGEN_REPARTITION_OTHER_LAYOUT_S", 60.0)
# Re-carve idle MIG GPUs ahead of the arrivals forecast (whalegen.scheduling.precarve): on/off, GPUs per
# cycle, and the least confidence in the forecast mix (1 - its held-out total-variation distance).
# Off by default: in the MIG-layout replay (docs/notes/goodput-design.md §9a) only a perfect forecast
# helped; one barely better than persistence (the arrivals model's held-out mix distance, 0.41 vs 0.43)
# did harm.
WHALEGEN_PRECARVE = envbool("WHALEGEN_PRECARVE", False)
WHALEGEN_PRECARVE_MAX_GPUS = envint("WHALEGEN_PRECARVE_MAX_GPUS", 2)
WHALEGEN_PRECARVE_MIN_CONFIDENCE = envfloat("WHALEGEN_PRECARVE_MIN_CONFIDENCE", 0.5)
# Agents (apps.fleet): the pace the plane sets, when a silent node counts as lost, stop grace.
WHALEGEN_AGENT_HEARTBEAT_S = envfloat("WHALEGEN_AGENT_HEARTBEAT_S", 10.0)
# 0: agents hold no long poll; they fetch their desired state once after registering and when a heartbeat's
# answer names a newer generation. A long poll holds a gunicorn thread per agent for its wait, so with the
# image's 4 workers x 8 threads a few dozen polling agents queue heartbeats and API calls behind them
# (measured with real agents: docs/notes/agent-fleet.md). The demo sets 20 for itself (start latency).
WHALEGEN_AGENT_POLL_WAIT_S = envfloat("WHALEGEN_AGENT_POLL_WAIT_S", 0.0)
WHALEGEN_NODE_LOST_HEARTBEATS = envint("WHALEGEN_NODE_LOST_HEARTBEATS", 3)
WHALEGEN_AGENT_STOP_GRACE_S = envfloat("WHALEGEN_AGENT_STOP_GRACE_S", 10.0)
# Isolation on GPU hosts (docs/isolation.md, docs/api.md "Runtimes and images"): every tenant's runs take
# one unprivileged uid (= gid) from [BASE, BASE + COUNT); a tenant without its own `run_uid` gets
# BASE + its id. Far above the uids a host's own accounts use (Debian gives users 1000-59999 and
# subordinate ranges start at 100000), so a task's uid is never a person's or a service's on the host.
WHALEGEN_TASK_UID_BASE = envint("WHALEGEN_TASK_UID_BASE", 200_000)
WHALEGEN_TASK_UID_COUNT = envint("WHALEGEN_TASK_UID_COUNT", 100_000)
if WHALEGEN_TASK_UID_BASE < 1000 or WHALEGEN_TASK_UID_COUNT < 1:
    raise ConfigError(
        "WHALEGEN_TASK_UID_BASE must be at least 1000 (below it are the host's system accounts) and "
        "WHALEGEN_TASK_UID_COUNT at least 1"
    )
# Processes and threads one run may hold at once (the cgroup's pids.max): a fork bomb stops there.
WHALEGEN_TASK_PIDS_MAX = envint("WHALEGEN_TASK_PIDS_MAX", 4096)
# How long a released task the agent still runs is listed as `stop` (afterwards omission stops it).
WHALEGEN_AGENT_STOP_LIST_S = envfloat("WHALEGEN_AGENT_STOP_LIST_S", 600.0)
# Requeues (a task lost with its node or run, or preempted) back off exponentially: the first waits
# WHALEGEN_REQUEUE_BACKOFF_S, each next one twice as long, at most WHALEGEN_REQUEUE_BACKOFF_MAX_S. A task
# that has run WHALEGEN_MAX_ATTEMPTS times and is requeued again ends `failed` with its attempt history.
WHALEGEN_REQUEUE_BACKOFF_S = envfloat("WHALEGEN_REQUEUE_BACKOFF_S", 5.0)
WHALEGEN_REQUEUE_BACKOFF_MAX_S = envfloat("WHALEGEN_REQUEUE_BACKOFF_MAX_S", 300.0)
WHALEGEN_MAX_ATTEMPTS = envint("WHALEGEN_MAX_ATTEMPTS", 5)
# Telemetry is kept at most once per this many seconds per node (heartbeats come more often).
WHALEGEN_TELEMETRY_SAMPLE_S = envfloat("WHALEGEN_TELEMETRY_SAMPLE_S", 30.0)
# Heartbeats that change nothing are recorded in Redis and moved to PostgreSQL in batches by the
# node-health check (apps.fleet.liveness); needs REDIS_URL. false: every heartbeat is a transaction.
WHALEGEN_HEARTBEAT_REDIS = envbool("WHALEGEN_HEARTBEAT_REDIS", True)
# Idle reclaim (docs/idle-reclaim.md): a running task whose every GPU reported SM utilisation
# below WHALEGEN_IDLE_UTIL_PCT in every sample of the last WHALEGEN_IDLE_AFTER_S is flagged idle.
WHALEGEN_IDLE_AFTER_S = envfloat("WHALEGEN_IDLE_AFTER_S", 1_800.0)
WHALEGEN_IDLE_UTIL_PCT = envint("WHALEGEN_IDLE_UTIL_PCT", 5)
# Run output (apps.logs): what the plane keeps per run (the first half of the cap and the latest rest;
# agents cap their side with --log-cap-mib) and for how long after the task ended.
WHALEGEN_LOG_CAP_MIB = envfloat("WHALEGEN_LOG_CAP_MIB", 10.0)
WHALEGEN_LOG_RETENTION_DAYS = envint("WHALEGEN_LOG_RETENTION_DAYS", 30)
# `GET /metrics` (Prometheus): with a token set, a scraper must send it as a bearer token and nothing
# else is let in; unset, platform admins only (docs/metrics.md).
WHALEGEN_METRICS_TOKEN = envstr("WHALEGEN_METRICS_TOKEN")
# `/readyz`: beat counts as seen while its last plane-tick is younger than this (default: four ticks), and
# the broker's PING has this long to answer.
WHALEGEN_READY_BEAT_MAX_AGE_S = envfloat(
    "WHALEGEN_READY_BEAT_MAX_AGE_S", 4 * envfloat("WHALEGEN_PLANE_TICK_INTERVAL_S", 15.0)
)
WHALEGEN_READY_BROKER_TIMEOUT_S = envfloat("WHALEGEN_READY_BROKER_TIMEOUT_S", 1.0)
WHALEGEN_TRACES_DIR = envstr("WHALEGEN_TRACES_DIR", str(BASE_DIR.parent / "shared" / "traces"))

# JSON lines, or plain ones with WHALEGEN_LOG_FORMAT=plain (a person's terminal: `whalegen demo`);
# request/task/tenant/node context and credentials redacted in both (whalegen/config/logging.py).
# gunicorn's own lines: docker/gunicorn.conf.py; Celery's: whalegen/config/celerylog.py.
LOGGING = logging_config(
    fmt=envstr("WHALEGEN_LOG_FORMAT", "json") or "json",
    level=envstr("WHALEGEN_LOG_LEVEL", "INFO") or "INFO",
    access_level=envstr("WHALEGEN_ACCESS_LOG_LEVEL", "INFO") or "INFO",
)
# Celery workers and beat keep this configuration instead of installing their own root handler.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
