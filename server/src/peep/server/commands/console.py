"""``peep console add-user|reset-password|users --config server.toml``: the operator console's accounts.

``add-user --name NAME --role {admin,operator,enrol}`` creates an account and prints a one-time password
(once: only its scrypt hash is stored); the account must choose its own password at first login.
``reset-password --name NAME`` replaces an account's password with a new one-time password and ends its
sessions. ``users`` lists the accounts. Each is written to the console's audit log as done by ``cli``.
"""

from __future__ import annotations

import argparse
from typing import Any

from peep.server.commands._config import add_config_option, load, say
from peep.server.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("console", help="operator console accounts (add-user, reset-password, users)")
    cmds = p.add_subparsers(dest="console_command", metavar="ACTION", required=True)
    add = cmds.add_parser("add-user", help="create an account and print its one-time password")
    add_config_option(add)
    add.add_argument("--name", required=True, help="account name: 1-64 of [A-Za-z0-9_.@-]")
    add.add_argument("--role", required=True, choices=("admin", "operator", "enrol"), help="what the account may do")
    add.set_defaults(handler=add_user)
    reset = cmds.add_parser("reset-password", help="give an account a new one-time password (ends its sessions)")
    add_config_option(reset)
    reset.add_argument("--name", required=True)
    reset.set_defaults(handler=reset_password)
    users = cmds.add_parser("users", help="list the accounts")
    add_config_option(users)
    users.set_defaults(handler=list_users)


def _store(args: argparse.Namespace) -> Any:
    from peep.server.config import ConfigError, resolve_secrets
    from peep.server.console.store import ConsoleStore
    from peep.server.storage import open_store

    config = load(args)
    try:
        secrets = resolve_secrets(config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    pw = secrets.db_password.get_secret_value() if secrets.db_password else None
    return ConsoleStore(open_store(config.storage, password=pw))


def add_user(args: argparse.Namespace) -> int:
    from peep.server.console.accounts import create_account

    store = _store(args)
    try:
        password = create_account(store, args.name, args.role, field="--name")
    except ValueError as exc:  # the name or role, or an existing account
        raise UsageError(str(exc)) from None
    finally:
        store.store.close()
    say(f"account {args.name!r} ({args.role}) created; one-time password (shown once, change it at first login):")
    say(password)
    return 0


def reset_password(args: argparse.Namespace) -> int:
    from peep.server.console import accounts

    try:
        accounts.check_name(args.name, "--name")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    store = _store(args)
    try:
        password = accounts.one_time_password()
        if not store.reset_password(args.name, accounts.hash_password(password), must_change=True):
            raise UsageError(f"--name: expected an existing account, received {args.name!r}")
        store.audit("cli", "reset-password", args.name, "ok", "local")
    finally:
        store.store.close()
    say(f"account {args.name!r}: new one-time password (shown once; its sessions have ended):")
    say(password)
    return 0


def list_users(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        for a in store.accounts():
            state = "disabled" if a.disabled else ("one-time password" if a.must_change else "active")
            say(f"{a.name}\t{a.role}\t{state}")
    finally:
        store.store.close()
    return 0
