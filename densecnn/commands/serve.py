"""``densecnn serve``: the web service (API + page) under uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import tempfile
from pathlib import Path

from ..errors import InvalidInputError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the models of a directory over HTTP (API, web page, metrics)",
        description="Serve every model under --model-dir: POST images to /v1/models/NAME/segment, or open / in a "
        "browser. Other settings come from DENSECNN_* environment variables (see docs/service.md).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=8000, help="port (default: 8000)")
    parser.add_argument("--model-dir", help="directory of model directories (default: models/)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    parser.set_defaults(run=run)


def _port(text: str) -> int:
    """A TCP port number, 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: give 0 to 65535 (e.g. 8000)")
    return port


def run(args) -> int:
    from densecnn_app.registry import model_dirs

    if args.workers < 1:
        raise InvalidInputError(f"--workers must be at least 1, got {args.workers}")
    public = not _loopback(args.host)
    settings = _settings(args, public)
    make_data_dir(settings)
    if settings.require_keys:
        _check_keys(settings)
    elif public:
        print(
            f"densecnn serve: warning: listening on {args.host} without API keys (DENSECNN_REQUIRE_KEYS=false): "
            "anyone who reaches this address may run jobs and read every anonymous job",
            file=sys.stderr,
        )
    if not model_dirs(settings.model_dir):
        raise FileNotFoundError(
            f"no models in {settings.model_dir} (no subdirectory holds a model.json); "
            "train or copy one there, or pass --model-dir"
        )
    # uvicorn handles SIGTERM (drains, then shuts down) and re-raises it afterwards: a no-op handler makes that
    # clean shutdown exit 0 instead of dying by the signal (143)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    if args.workers == 1:
        _serve(settings, args)
    else:
        _serve_workers(settings, args)
    return 0


def _settings(args, public: bool):
    """The service's settings: the DENSECNN_* environment's, ``--model-dir``, and the command's defaults where the
    environment leaves a setting unset (threads shared by the workers; keys when reachable from other machines)."""
    settings = environment_settings(**({"model_dir": args.model_dir} if args.model_dir else {}))
    defaults = {}
    if args.workers > 1 and "torch_threads" not in settings.model_fields_set:
        defaults["torch_threads"] = max(1, (os.cpu_count() or 1) // args.workers)
    if public and "require_keys" not in settings.model_fields_set:
        defaults["require_keys"] = True  # reachable from other machines: keys unless said otherwise
    return settings.model_copy(update=defaults)


def environment_settings(**given):
    """The service's settings from the DENSECNN_* environment and ``given`` ones; bad ones refused in one line
    naming each (what ``serve`` and ``keys`` read).

    Raises:
        InvalidInputError: a setting is not valid, or a variable's value does not parse.
    """
    from densecnn_app.settings import Settings
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc']))}: {error['msg'].removeprefix('Value error, ')}"
            for error in exc.errors()
        )
        raise InvalidInputError(f"invalid service settings: {problems}") from None
    except SettingsError as exc:  # a list or object variable (DENSECNN_WARM_SIZES) that is not JSON
        reason = f" ({exc.__cause__})" if exc.__cause__ else ""
        raise InvalidInputError(
            f"invalid service settings: {exc}{reason}; give lists and objects as JSON, e.g. "
            "DENSECNN_WARM_SIZES='[[512, 512]]'"
        ) from None


def make_data_dir(settings) -> None:
    """Make the data directory, mode 0700 (as the server keeps it), and check that files can be written in it: a
    directory that cannot be created or written (a volume mounted read-only, another user's) is one line naming it,
    before any model is loaded."""
    import tempfile

    from densecnn_app.privacy import private_directory

    fix = "set DENSECNN_DATA_DIR to a writable directory for the jobs and the key database"
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(
            f"invalid service settings: data_dir: {settings.data_dir}: cannot be created ({exc.strerror}); {fix}"
        ) from None
    try:
        private_directory(settings.data_dir)
        with tempfile.TemporaryFile(dir=settings.data_dir):
            pass
    except OSError as exc:
        raise InvalidInputError(
            f"invalid service settings: data_dir: {settings.data_dir}: cannot be written ({exc.strerror}); {fix} "
            "(a volume mounted read-write, owned by the server's user)"
        ) from None


def _serve(settings, args) -> None:
    """One process: the app is built here, with ``settings``."""
    import uvicorn
    from densecnn_app.main import create_app
    from densecnn_app.server import uvicorn_options

    uvicorn.run(create_app(settings), host=args.host, port=args.port, **uvicorn_options(settings))


def _serve_workers(settings, args) -> None:
    """``args.workers`` processes, each building the app with ``settings`` from the files uvicorn is handed (its
    ``env_file``), in a private directory removed when the server stops."""
    import uvicorn
    from densecnn_app.server import uvicorn_options
    from densecnn_app.worker_settings import write_worker_environment

    with tempfile.TemporaryDirectory(prefix="densecnn-serve-") as directory:
        uvicorn.run(
            "densecnn_app.main:create_worker_app",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            env_file=write_worker_environment(settings, Path(directory)),
            **uvicorn_options(settings),
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def _check_keys(settings) -> None:
    """Refuse to start with keys required and none created: every request would be refused."""
    from densecnn_app.jobs.db import make_engine
    from densecnn_app.keys import KeyStore
    from sqlalchemy import make_url

    engine = make_engine(settings.database)
    try:
        count = KeyStore(engine).count()
    finally:
        engine.dispose()
    if not count:
        database = make_url(settings.database).render_as_string(hide_password=True)
        raise InvalidInputError(
            "API keys are required (the server listens beyond this machine, or DENSECNN_REQUIRE_KEYS=true) but "
            f"there are none in {database}: create one with `densecnn keys add NAME` (same DENSECNN_* "
            "settings), or listen on 127.0.0.1, or set DENSECNN_REQUIRE_KEYS=false behind a gateway that "
            "authenticates"
        )
