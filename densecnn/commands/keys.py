"""``densecnn keys add|list|remove``: the service's API keys, in its database (the server's DENSECNN_* settings)."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "keys",
        help="create, list and remove the service's API keys",
        description="API keys of `densecnn serve`, kept hashed in its database: DENSECNN_DATABASE_URL, else "
        "jobs.db in DENSECNN_DATA_DIR (set them as for the server). Clients send Authorization: Bearer KEY; the key "
        "(not its name) owns the jobs made with it, so a key added again under a removed key's name sees none of "
        "the old key's jobs.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="create a key and print it (once: only its hash is kept)")
    add.add_argument("name", help="who holds the key: letters, digits, . _ @ -")
    actions.add_parser("list", help="the names of the keys")
    remove = actions.add_parser("remove", help="revoke a key (its jobs stay until they expire)")
    remove.add_argument("name")
    parser.set_defaults(run=run)


def run(args) -> int:
    from sqlalchemy.exc import DatabaseError

    from ..errors import DenseCNNError

    try:
        return _run(args)
    except DatabaseError as exc:  # not a database, read-only, locked: one line, not SQLAlchemy's traceback
        from sqlalchemy.engine import make_url

        from .serve import environment_settings

        database = make_url(environment_settings().database).render_as_string(hide_password=True)
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise DenseCNNError(
            f"the key database {database} cannot be used ({reason}); make it a writable database of "
            "`densecnn serve`, or point DENSECNN_DATABASE_URL or DENSECNN_DATA_DIR at one"
        ) from None


def _run(args) -> int:
    import sys

    from densecnn_app.jobs.db import make_engine
    from densecnn_app.keys import KeyStore
    from densecnn_app.privacy import private_database, private_directory

    from .serve import environment_settings, make_data_dir

    settings = environment_settings()
    make_data_dir(settings)
    private_directory(settings.data_dir)
    keys = KeyStore(make_engine(settings.database))
    private_database(settings)
    if args.action == "add":
        print(keys.add(args.name))
        print(
            f"the key of {args.name!r}: give it to its holder now, it cannot be shown again", file=sys.stderr
        )
    elif args.action == "list":
        for name in keys.names():
            print(name)
    elif not keys.remove(args.name):
        print(f"densecnn keys: no key named {args.name!r}", file=sys.stderr)
        return 1
    return 0
