"""Container healthcheck: exit 0 when URL answers 200, else 1 (stdlib only, the images carry no curl).

    python healthcheck.py http://127.0.0.1:8000/readyz [CHECK]

With CHECK (a `/readyz` check name, e.g. `beat`), only that check's outcome counts: beat's container asks
the plane whether its ticks arrive, whatever else is failing.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    url = argv[0]
    check = argv[1] if len(argv) > 1 else None
    try:
        with urllib.request.urlopen(url, timeout=4) as answer:
            status, body = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    except OSError as error:
        print(f"{url}: {error}", file=sys.stderr)
        return 1
    if check is None:
        return 0 if status == 200 else 1
    try:
        outcome = json.loads(body)["checks"][check]
    except (ValueError, KeyError, TypeError):
        print(f"{url}: no check {check!r} in the answer (HTTP {status})", file=sys.stderr)
        return 1
    print(f"{check}: {outcome.get('detail')}")
    return 0 if outcome.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
