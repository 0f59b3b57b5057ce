"""Celery's own output in the plane's log format (docs/logs-and-metrics.md, "Logs"): every line a worker or
beat writes goes through the handler of the settings' `LOGGING`, so it is JSON (or plain, by choice), carries
`component` (`worker` / `beat`) and the Celery task's id, and is redacted.

What Celery does on its own, and what replaces it here:
- it installs its own handlers and formatters (the root logger's, the `celery.task` logger's with
  propagation off) unless a receiver answers its `setup_logging` signal; `keep_plane_logging` answers it,
  in the main process and in each prefork child, so Celery configures nothing;
- the worker prints a multi-line banner straight to the terminal (`sys.__stdout__`), and beat two more;
  `PlaneWorker` and `PlaneBeat` log them instead, one record each;
- the worker's signal handlers write `worker: Warm shutdown (MainProcess)` and the like with a raw
  `os.write` (`celery.apps.worker.safe_say`: a signal handler must not take the logging lock);
  `say_in_json` replaces that function and writes one formatted line with the same raw write;
- with a `setup_logging` receiver Celery no longer sends the processes' own `print` and stray stderr
  writes to a logger (`worker_redirect_stdouts`); `PlaneWorker` does, as Celery would have, so a task's
  `print` becomes a JSON line of the `celery.redirected` logger too;
- Python's warnings go to the `py.warnings` logger (`logging.captureWarnings`), not to raw stderr.
"""

from __future__ import annotations

import logging
import logging.config
import os
import sys
from typing import Any, TextIO

import celery.apps.worker
from celery import VERSION_BANNER, Celery, signals
from celery.apps.beat import Beat
from celery.apps.worker import Worker

from whalegen.logformat import RedactFilter, formatter_for, set_component

log = logging.getLogger("whalegen.celery")


def keep_plane_logging(loglevel: int | str | None = None, **_: Any) -> None:
    """Celery's `setup_logging` signal: any receiver stops Celery's own set-up. The settings' `LOGGING` is
    applied when nothing configured the root logger yet (a prefork child inherits its parent's handlers,
    whose stream is the real stderr even once the parent's `sys.stderr` is redirected); the command's
    `--loglevel` sets the root level, as Celery's own set-up would."""
    logging.captureWarnings(True)
    if not logging.getLogger().handlers:
        from django.conf import settings

        logging.config.dictConfig(settings.LOGGING)
    if loglevel:
        logging.getLogger().setLevel(loglevel)


def say_in_json(msg: str, f: TextIO = sys.__stderr__) -> None:  # type: ignore[assignment]
    """`celery.apps.worker.safe_say`'s job — a line from a signal handler, written with one `os.write` and
    no lock — in the format of the root handler (the settings' `LOGGING`), redacted."""
    handlers = logging.getLogger().handlers
    formatter = (handlers[0].formatter if handlers else None) or formatter_for("json")
    record = logging.LogRecord("celery.apps.worker", logging.INFO, __file__, 0, msg.strip(), None, None)
    RedactFilter().filter(record)
    if hasattr(f, "fileno") and f.fileno() is not None:
        os.write(f.fileno(), (formatter.format(record) + "\n").encode())


class PlaneWorker(Worker):  # type: ignore[misc]
    """`celery worker` with its banner logged and its stdout/stderr sent to a logger."""

    def on_before_init(self, **kwargs: Any) -> None:
        # Before Celery's own checks, whose warnings (running as root) would otherwise reach raw stderr.
        set_component("worker")
        keep_plane_logging()
        super().on_before_init(**kwargs)

    def emit_banner(self) -> None:
        info = self.startup_info(artlines=False).strip()
        log.info("celery worker starting: %s", " | ".join(line.strip() for line in info.splitlines() if line))

    def on_start(self) -> None:
        super().on_start()
        if self.redirect_stdouts:
            self.app.log.redirect_stdouts(self.redirect_stdouts_level)


class PlaneBeat(Beat):  # type: ignore[misc]
    """`celery beat` with its two start-up prints logged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        set_component("beat")
        kwargs["quiet"] = True  # the prints this replaces; nothing else reads it
        super().__init__(*args, **kwargs)

    def run(self) -> None:
        log.info(
            "celery beat v%s is starting: scheduler %s, schedule %s, max interval %s s",
            VERSION_BANNER,
            self.scheduler_cls,
            self.schedule,
            self.max_interval,
        )
        super().run()

    def setup_logging(self, colorize: bool | None = None) -> None:
        super().setup_logging(colorize)
        if self.redirect_stdouts:
            self.app.log.redirect_stdouts(self.redirect_stdouts_level)


def install(app: Celery) -> None:
    """Make `celery -A whalegen.config worker|beat` log as the plane does (see the module docstring)."""
    app.Worker = app.subclass_with_self(PlaneWorker)
    app.Beat = app.subclass_with_self(PlaneBeat)
    signals.setup_logging.connect(keep_plane_logging, weak=False)
    celery.apps.worker.safe_say = say_in_json
