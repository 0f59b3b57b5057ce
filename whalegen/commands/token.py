"""`whalegen token create --user U --tenant T`: an operator makes an API token, straight in the database.

The token is printed once; only its hash is stored. Runs wherever the plane's settings point
(DATABASE_URL, or the embedded SQLite of `whalegen demo` under WHALEGEN_DATA_DIR).
"""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="create a token and print it once")
    create.add_argument("--user", required=True, help="username of the token's owner")
    create.add_argument("--tenant", required=True, help="tenant slug the token is scoped to")
    create.add_argument("--name", default="cli", help="a label to tell tokens apart")
    create.add_argument(
        "--ttl-days", type=int, default=None, help="days until expiry; 0 = never (default 90)"
    )


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "whalegen.config.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.exceptions import ValidationError

    from apps.tenants.selectors import tenant_get_by_slug
    from apps.tenants.services import token_create

    user = get_user_model().objects.filter(username=args.user).first()
    if user is None:
        print(f"whalegen: no user {args.user!r}", file=sys.stderr)
        return 1
    tenant = tenant_get_by_slug(slug=args.tenant)
    if tenant is None:
        print(f"whalegen: no tenant {args.tenant!r}", file=sys.stderr)
        return 1
    try:
        token, raw = token_create(user=user, tenant=tenant, name=args.name, ttl_days=args.ttl_days)
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            for message in messages:
                print(f"whalegen: {field}: {message}", file=sys.stderr)
        return 1
    expiry = token.expires_at.isoformat(timespec="seconds") if token.expires_at else "never"
    print(raw)
    print(
        f"token {token.prefix}… for {args.user} in {args.tenant}, expires {expiry}; shown once",
        file=sys.stderr,
    )
    return 0
