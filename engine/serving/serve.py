"""`python -m engine serve`: the engine in its own process, and an HTTP server in this one.

Owns the command line and running uvicorn around engine/serving/app.py for a client. ``serve()``
takes the client object, so the server runs the same whether this process started the
engine (``main``) or attached to one that runs already; BackgroundServer runs the same
app on a thread of a process busy with something else (the dashboard). Binds 127.0.0.1 unless told
otherwise; the API key may come from GAPLESS_API_KEY so that it does not show in `ps`.
It must never run the HTTP server in the engine process (docs/design.md, Processes).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from engine import envs
from engine.serving import limits
from engine.serving.limits import MAX_BODY_BYTES, Bounds
from engine.serving.protocol import (
    HEADER_TIMEOUT_S,
    MAX_CONNECTIONS,
    WRITE_TIMEOUT_S,
    with_rules,
)
from engine.serving.supervise import POLICIES, EngineSupervisor, say

FILES_RESERVED = 256  # open files kept for the engine's pipes, the model's files, the logs

USAGE = """\
python -m engine serve [--host 127.0.0.1] [--port 8000] [--config config.yaml] [--api-key KEY]

OpenAI-compatible API: POST /v1/completions, POST /v1/chat/completions (stream or not),
GET /v1/models; GET /health; GET /metrics (Prometheus text format)."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine serve", usage=USAGE,
                                 description="Serve the engine over an OpenAI-compatible "
                                             "HTTP API, with Prometheus metrics.")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8000, help="port (0: any free one)")
    ap.add_argument("--config", default="config.yaml")
    ap.add_argument("--model", help="override config.yaml's model (folder or hub id)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/* "
                                      "(default: $GAPLESS_API_KEY, else no key)")
    ap.add_argument("--served-model-name", nargs="+", metavar="NAME",
                    help="one or more names clients may send as `model`; the first answers "
                    "in responses and labels /metrics (default: the model's hub id where "
                    "known, e.g. from hub_id.txt beside its weights, else its folder's name)")
    ap.add_argument("--chat-template", help="a Jinja chat template (a file, or the template "
                                            "itself) for a model without one")
    ap.add_argument("--listen", metavar="PATH", default=None,
                    help="Unix socket other local clients (the dashboard) attach to; default: "
                    "engine.process.endpoint.default_socket_path()")
    ap.add_argument("--no-listen", action="store_true",
                    help="do not accept other local clients")
    ap.add_argument("--attach", metavar="PATH", default=None,
                    help="serve an engine that is already running (its socket) instead of "
                    "starting one; --config still names its model's tokenizer")
    ap.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES,
                    help="refuse request bodies larger than this with 413 before reading "
                         f"them (default {MAX_BODY_BYTES})")
    ap.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT_S, metavar="S",
                    help="a request's line and headers must arrive within S seconds, else "
                         f"408 and the connection is closed (default {HEADER_TIMEOUT_S:g})")
    ap.add_argument("--body-timeout", type=float, default=limits.BODY_TIMEOUT_S, metavar="S",
                    help="a request's body must arrive within S seconds of its headers, "
                         f"else 408 (default {limits.BODY_TIMEOUT_S:g})")
    ap.add_argument("--write-timeout", type=float, default=WRITE_TIMEOUT_S, metavar="S",
                    help="a client that reads nothing of its answer for S seconds is cut off "
                         f"and its request aborted (default {WRITE_TIMEOUT_S:g})")
    ap.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, metavar="N",
                    help="connections kept open at once; one more is answered 503 with "
                         f"Retry-After (default {MAX_CONNECTIONS}, at most what the "
                         "process's open-file limit allows)")
    ap.add_argument("--max-inflight", type=int, default=limits.MAX_INFLIGHT, metavar="N",
                    help="requests between their submit and the end of their answer; one "
                         "more is answered 503 with Retry-After before it is tokenized "
                         f"(default {limits.MAX_INFLIGHT})")
    ap.add_argument("--max-tokenizing", type=int, default=limits.MAX_TOKENIZING, metavar="N",
                    help="prompts tokenized at once; prompts of up to "
                         f"{limits.MAX_TOKENIZE_WAITING_CHARS} characters in all may wait, "
                         f"beyond that 503 (default {limits.MAX_TOKENIZING})")
    ap.add_argument("--engine-timeout", type=float, default=30.0, metavar="S",
                    help="an engine silent for S seconds (hung, stopped) fails its requests "
                         "with 503 / an error event and aborts them (default 30)")
    ap.add_argument("--on-engine-death", choices=POLICIES, default="restart",
                    help="when the engine process dies: restart it with the same settings "
                         "(with backoff; with --attach: re-attach once its owner has "
                         "restarted it), exit with code 3 (for a supervisor), or stay up "
                         "answering 503 (default restart)")
    ap.add_argument("--exit-with-parent", action="store_true",
                    help="exit when the process that started this one is gone (the "
                         "dashboard starts its HTTP API so)")
    ap.add_argument("--max-engine-restarts", type=int, default=5, metavar="N",
                    help="restart attempts in a row, and deaths within 5 minutes, before "
                         "serve gives up and exits with code 3 (default 5)")
    ap.add_argument("--log-level", default="info",
                    choices=["critical", "error", "warning", "info", "debug"])
    return ap


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 picks a free one (read it back with getsockname)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it. Without it, a response written in two parts (headers,
    # then body or a stream chunk) waits for the client's delayed ACK (tens of milliseconds
    # on every keep-alive request, /metrics included).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e}") from e
    sock.listen(2048)
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def tokenizer_of(config: Any, chat_template: str | None = None) -> Any:
    """The tokenizer of an EngineConfig's model (or its ``tokenizer`` override)."""
    from engine.serving.prompts import load_tokenizer

    return load_tokenizer(config.tokenizer or config.model,
                          trust_remote_code=config.trust_remote_code,
                          chat_template=chat_template)


def serve(client: Any, *, host: str = "127.0.0.1", port: int = 8000,
          sock: socket.socket | None = None, api_key: str | None = None,
          served_model_name: str | list[str] | None = None, chat_template: str | None = None,
          tokenizer: Any = None, log_level: str = "info", bounds: Bounds | None = None,
          header_timeout_s: float = HEADER_TIMEOUT_S, write_timeout_s: float = WRITE_TIMEOUT_S,
          max_connections: int = MAX_CONNECTIONS, on_engine_death: str = "stay",
          max_engine_restarts: int = 5, parent_pid: int | None = None) -> int:
    """Serve ``client`` (an EngineClient, or any object with its methods) until Ctrl-C or
    SIGTERM, on ``sock`` when given (from bind()), else on host:port. ``tokenizer``
    defaults to the one of the client's config (its tokenizer or model folder).
    ``on_engine_death``: supervise.py's policy. ``parent_pid``: stop serving once this
    process's parent is no longer that process. Returns the exit code (3 when it stopped because the
    engine died). ValueError for a bad tokenizer, chat template or address."""
    import uvicorn

    from engine.serving.app import create_app

    if tokenizer is None:
        config = getattr(client, "config", None)
        if config is None:
            raise ValueError("give a tokenizer: the client has no config to load it from")
        tokenizer = tokenizer_of(config, chat_template)
    app = create_app(client, tokenizer=tokenizer, served_model_name=served_model_name,
                     api_key=api_key, bounds=bounds)
    if sock is None:
        sock = bind(host, port)
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    names = app.state.served_model_names
    name = names[0] if len(names) == 1 else names
    print(f"gapless: serving {name!r} at http://{shown}:{bound_port}/v1 "
          f"(metrics: /metrics; auth: {'API key' if api_key else 'none'})", flush=True)
    if not _is_loopback(host) and not api_key:
        print(f"gapless: warning: listening on {host} without an API key: anyone who can "
              "reach this machine can use the engine", file=sys.stderr, flush=True)
    log_to_stderr(log_level)
    rules = with_rules(header_timeout_s, write_timeout_s, connection_cap(max_connections))
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level,
                                           timeout_graceful_shutdown=5, http=rules))
    code = [0]

    def stop_serving(exit_code: int) -> None:
        code[0] = exit_code
        server.should_exit = True

    supervisor = EngineSupervisor(client, on_engine_death, stop_serving=stop_serving,
                                  note=lambda text: setattr(app.state, "engine_note", text),
                                  max_restarts=max_engine_restarts).start()
    if parent_pid is not None:
        watch_parent(parent_pid, lambda: stop_serving(0))
    try:
        server.run(sockets=[sock])
    finally:
        supervisor.stop()
    return code[0]


def log_to_stderr(level: str) -> None:
    """gapless's own loggers (gapless.http, gapless.client...) print on stderr from ``level``
    on, as uvicorn's do."""
    logger = logging.getLogger("gapless")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:  %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def watch_parent(parent: int, gone: Callable[[], None], period_s: float = 1.0) -> None:
    """Call ``gone()`` once ``parent`` is no longer this process's parent (it exited: this
    process was re-parented), at once if that happened already."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period_s)
        say(f"the process that started this serve (pid {parent}) is gone; exiting")
        gone()
    threading.Thread(target=watch, daemon=True, name="gapless-parent-watch").start()


def connection_cap(wanted: int) -> int:
    """``wanted`` connections, or fewer when the open-file limit cannot hold them: the soft
    limit is raised to the hard one first, and FILES_RESERVED stay for everything else."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted * 2)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    except (ValueError, OSError):
        return wanted
    room = soft - FILES_RESERVED
    if room < wanted:
        say(f"--max-connections {wanted}: the open-file limit ({soft}) leaves room for "
            f"{max(room, 1)}; using that")
        return max(room, 1)
    return wanted


class BackgroundServer:
    """The HTTP API for ``client`` on a daemon thread of this process: for a process that
    holds a client for its own reasons (the dashboard) and serves HTTP beside it. The
    engine process stays free of HTTP either way. ``url`` once constructed; stop() ends it.
    """

    def __init__(self, client: Any, *, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, served_model_name: str | list[str] | None = None,
                 tokenizer: Any = None, log_level: str = "warning",
                 bounds: Bounds | None = None) -> None:
        import uvicorn

        from engine.serving.app import create_app

        if tokenizer is None:
            tokenizer = tokenizer_of(client.config)
        app = create_app(client, tokenizer=tokenizer, served_model_name=served_model_name,
                         api_key=api_key, bounds=bounds)
        self._sock = bind(host, port)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self._sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level,
                                                    timeout_graceful_shutdown=2,
                                                    http=with_rules()))
        self._thread = threading.Thread(target=self.server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True,
                                        name="gapless-http-server")
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (idempotent); open streams get ``timeout_graceful_shutdown``."""
        self.server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()


def main(argv: list[str] | None = None) -> int:
    parent = os.getppid()  # before anything that takes time: it may die meanwhile
    args = build_parser().parse_args(argv)
    if args.api_key is None:
        # Set but empty is refused as --api-key "" is, not read as "no key" (envs.get's None).
        args.api_key = envs.get(envs.GAPLESS_API_KEY) or (
            "" if envs.GAPLESS_API_KEY in os.environ else None)
        key_from = f"${envs.GAPLESS_API_KEY}"
    else:
        key_from = "--api-key"
    if args.api_key is not None and not args.api_key.strip():
        print(f"error: {key_from} is empty: give a key, or leave it unset to serve without "
              "authentication", file=sys.stderr)
        return 2
    if args.max_body_bytes < 1024:
        print(f"error: --max-body-bytes {args.max_body_bytes}: give at least 1024",
              file=sys.stderr)
        return 2
    for flag, value in (("--header-timeout", args.header_timeout),
                        ("--body-timeout", args.body_timeout),
                        ("--write-timeout", args.write_timeout),
                        ("--engine-timeout", args.engine_timeout)):
        if not value > 0:
            print(f"error: {flag} {value:g}: give a number of seconds > 0", file=sys.stderr)
            return 2
    for flag, n in (("--max-tokenizing", args.max_tokenizing),
                    ("--max-connections", args.max_connections),
                    ("--max-inflight", args.max_inflight),
                    ("--max-engine-restarts", args.max_engine_restarts)):
        if n < 1:
            print(f"error: {flag} {n}: give at least 1", file=sys.stderr)
            return 2
    api_key = args.api_key
    overrides = {k: v for k, v in (("model", args.model), ("device", args.device)) if v}
    from engine.config import EngineConfig
    from engine.process.client import EngineClient, EngineStartError
    from engine.serving.prompts import read_chat_template

    sock: socket.socket | None = None
    try:  # what can be wrong is told before the model loads
        config = EngineConfig.from_yaml(args.config, **overrides)
        template = None if args.chat_template is None else read_chat_template(
            args.chat_template)
        sock = bind(args.host, args.port)
        tokenizer = tokenizer_of(config, template)
        listen = None
        if args.attach:
            client = EngineClient.attach(args.attach, give_up_after_s=args.engine_timeout)
        else:
            if not args.no_listen:
                from engine.process.endpoint import default_socket_path

                listen = args.listen or default_socket_path()
            client = EngineClient(args.config, listen=listen,
                                  give_up_after_s=args.engine_timeout, **overrides)
        if listen is not None:
            print(f"gapless: the dashboard can watch this engine: "
                  f"GAPLESS_ENGINE_SOCKET={listen} streamlit run app.py", file=sys.stderr)
    except (ValueError, EngineStartError) as e:
        if sock is not None:
            sock.close()
        if isinstance(e, EngineStartError):
            print(f"error: the engine could not start: {e.reason}", file=sys.stderr)
            return 1
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        bounds = Bounds(max_body_bytes=args.max_body_bytes, body_timeout_s=args.body_timeout,
                        max_tokenizing=args.max_tokenizing, max_inflight=args.max_inflight)
        return serve(client, host=args.host, sock=sock, api_key=api_key,
                     served_model_name=args.served_model_name, tokenizer=tokenizer,
                     log_level=args.log_level, bounds=bounds,
                     header_timeout_s=args.header_timeout,
                     write_timeout_s=args.write_timeout,
                     max_connections=args.max_connections,
                     on_engine_death=args.on_engine_death,
                     max_engine_restarts=args.max_engine_restarts,
                     parent_pid=parent if args.exit_with_parent else None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        client.shutdown()
