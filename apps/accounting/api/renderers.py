"""CSV for the accounting report: one line per row, the group columns first."""

from __future__ import annotations

import csv
import io
from typing import Any

from rest_framework.renderers import BaseRenderer

COLUMNS = ("gpu_hours", "tasks", "cost", "unpriced_gpu_hours")


class UsageCsvRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        groups = list(data["group_by"])
        writer.writerow([*groups, *COLUMNS, "currency"])
        for row in data["rows"]:
            writer.writerow(
                [row[g] for g in groups]
                + ["" if row[c] is None else row[c] for c in COLUMNS]
                + [data["currency"] or ""]
            )
        return out.getvalue().encode(self.charset)
