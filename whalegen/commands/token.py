"""`whalegen token create|ls|revoke`: a member makes, lists and revokes their own API tokens.

Two ways to make one:
- through the API (WHALEGEN_URL, WHALEGEN_TOKEN or --server/--token, as `submit` and `tasks`): the
  token is the caller's own, in a tenant they belong to, with a role no higher than theirs (and no
  higher than the token they call with), expiring within a year;
- `--user U` (or `--local`): an operator on the plane makes a token for any member, straight in the
  database with the plane's settings (DATABASE_URL, or the embedded SQLite of `whalegen demo` under
  WHALEGEN_DATA_DIR). That is how the very first token of a fresh plane comes to be, and what scripts
  that ran `whalegen token create --user U --tenant T` before self-service existed keep doing.

Either way the token is printed once, on stdout; only its hash is stored. `ls` and `revoke` go through
the API only: on the plane itself, the Django admin lists and revokes every token.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any

from whalegen.commands._errors import EXIT_INVALID, CliError
from whalegen.commands._http import ApiError, Client, add_connection_arguments, print_error

ROLES = ("viewer", "member", "admin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    create = sub.add_parser(
        "create",
        help="make a token and print it once",
        description="Through the API: a token of your own. With --user (or --local): an operator makes one "
        "for any member, in the plane's database.",
    )
    create.add_argument("--tenant", help="tenant slug (API default: your token's tenant, or your only one)")
    create.add_argument("--name", default="cli", help="a label to tell tokens apart (default: cli)")
    create.add_argument("--role", choices=ROLES, help="at most your own role there (default: that most)")
    expiry = create.add_mutually_exclusive_group()
    expiry.add_argument(
        "--ttl-days",
        type=int,
        default=None,
        help="days until expiry (default 90; at most 365 through the API; 0 = never, --user only)",
    )
    expiry.add_argument("--expires-at", help="expiry as an ISO 8601 time, e.g. 2027-03-31T18:00:00Z")
    create.add_argument("--user", help="operator on the plane: the username to make the token for")
    create.add_argument(
        "--local",
        action="store_true",
        help="make it in the plane's database (needs --user); implied by --user",
    )
    add_connection_arguments(create)
    ls = sub.add_parser("ls", help="list the tokens you may see, newest first (never their secrets)")
    ls.add_argument("--limit", type=int, default=100)
    add_connection_arguments(ls)
    revoke = sub.add_parser("revoke", help="revoke a token; it is refused from then on")
    revoke.add_argument("token_id", type=int, help="the token's id (`whalegen token ls`)")
    add_connection_arguments(revoke)


def _expiry_text(expires_at: str | None) -> str:
    return expires_at or "never"


def _print_created(token: dict[str, Any], secret: str) -> None:
    print(secret)
    print(
        f"token {token['id']} {token['prefix']}… ({token['name']}) for {token['user']} in {token['tenant']}, "
        f"role {token['role']}, expires {_expiry_text(token['expires_at'])}; shown once",
        file=sys.stderr,
    )


def _create(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name}
    for field in ("tenant", "role", "ttl_days", "expires_at"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    try:
        token = client.call("POST", "/tokens/", json=body)
    except ApiError as exc:
        return print_error(exc, sent=body)
    _print_created(token, token["secret"])
    return 0


def _ls(client: Client, args: argparse.Namespace) -> int:
    page = client.call("GET", "/tokens/", params={"limit": args.limit})
    print(f"{'ID':>5}  {'PREFIX':<11} {'NAME':<16} {'TENANT':<12} {'USER':<12} {'ROLE':<7} {'STATE':<8} "
          f"{'EXPIRES':<20} LAST USED")  # fmt: skip
    for token in page["results"]:
        expires = (token["expires_at"] or "never")[:19]
        used = (token["last_used_at"] or "-")[:19]
        print(f"{token['id']:>5}  {token['prefix'] + '…':<11} {token['name']:<16} {token['tenant']:<12} "
              f"{token['user']:<12} {token['role']:<7} {token['state']:<8} {expires:<20} {used}")  # fmt: skip
    shown = len(page["results"])
    if page["count"] > shown:
        print(f"({shown} of {page['count']}; use --limit)")
    return 0


def _revoke(client: Client, args: argparse.Namespace) -> int:
    token = client.call("POST", f"/tokens/{args.token_id}/revoke/")
    print(f"token {token['id']} {token['prefix']}… ({token['name']}): revoked {token['revoked_at']}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "create" and (args.user or args.local):
        return _create_local(args)
    try:
        client = Client.from_args(args)
        action = {"create": _create, "ls": _ls, "revoke": _revoke}[args.action]
        return action(client, args)
    except ApiError as exc:
        if exc.status == 404 and getattr(args, "token_id", None) is not None:
            message = f"no token {args.token_id} (or not one you may see)"
            return CliError(message, EXIT_INVALID).report()
        return print_error(exc)


def _create_local(args: argparse.Namespace) -> int:
    """The operator's path: the plane's database, any member, no expiry bound; audited as `operator`."""
    if not args.user:
        return CliError("--local makes a token for a named member; add --user USER", EXIT_INVALID).report()
    if not args.tenant:
        return CliError("--user needs --tenant: the tenant the token is scoped to", EXIT_INVALID).report()
    if args.server or args.token:
        return CliError(
            "--user makes the token in the plane's database, not through a server; drop --server/--token "
            "(or drop --user to make a token of your own through the API)",
            EXIT_INVALID,
        ).report()
    expires_at = None
    if args.expires_at is not None:
        try:
            expires_at = datetime.fromisoformat(args.expires_at)
        except ValueError:
            message = f"--expires-at {args.expires_at!r} is not an ISO 8601 time (e.g. 2027-03-31T18:00:00Z)"
            return CliError(message, EXIT_INVALID).report()
    from whalegen.commands._plane import plane_setup

    plane_setup()
    from django.contrib.auth import get_user_model
    from django.core.exceptions import ValidationError
    from django.utils import timezone

    from apps.common.errors import ApplicationError
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
    if expires_at is not None and timezone.is_naive(expires_at):
        expires_at = timezone.make_aware(expires_at)
    try:
        token, raw = token_create(
            user=user,
            tenant=tenant,
            name=args.name,
            role=args.role,
            ttl_days=args.ttl_days,
            expires_at=expires_at,
        )
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            for message in messages:
                print(f"whalegen: {field}: {message}", file=sys.stderr)
        return 1
    except ApplicationError as exc:
        print(f"whalegen: {exc.message}", file=sys.stderr)
        return 1
    expiry = token.expires_at.isoformat(timespec="seconds") if token.expires_at else None
    shown = {"id": token.pk, "prefix": token.prefix, "name": token.name, "user": args.user,
             "tenant": args.tenant, "role": token.role, "expires_at": expiry}  # fmt: skip
    _print_created(shown, raw)
    return 0
