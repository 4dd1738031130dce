"""`graphpool serve` / `python -m graphpool.server`: load the engine, log what it holds, run uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from graphpool.server.chat_options import DEFAULT_CHAT, ChatOptions, template_kwargs_arg

logger = logging.getLogger("graphpool.server")

DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0


def add_server_args(parser: argparse.ArgumentParser) -> None:
    from graphpool.server.protocol import DEFAULT_MAX_REQUEST_BYTES

    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all interfaces)")
    group.add_argument("--port", type=int, default=8000)
    group.add_argument(
        "--served-model-name", default=None, help="the model name clients send (default: the engine's)"
    )
    group.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    group.add_argument(
        "--max-request-bytes", type=_byte_size, default=DEFAULT_MAX_REQUEST_BYTES, metavar="BYTES",
        help="refuse (413) a request body larger than this, before reading it whole; e.g. 4MiB "
        "(default %(default)s)",
    )
    group.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT: refuse new requests, let running ones finish for up to this long, then end "
        "them with finish_reason 'abort' and exit; a second signal exits at once (default %(default)s)",
    )
    group.add_argument(
        "--graph-warmup-before-ready", action="store_true",
        help="capture the warm-up graphs (--graph-warmup) before answering ready; by default the server is ready "
        "first and captures them while no request is unfinished, one at a time (a request arriving meanwhile waits "
        "for at most the capture under way; a size needed sooner is captured or padded on its miss)",
    )


def add_api_args(parser: argparse.ArgumentParser) -> None:
    """`serve MODEL` (as `vllm serve MODEL`; --model still works), API keys, the chat template and the
    tool-call parser."""
    from graphpool.server.reasoning import REASONING_PARSERS
    from graphpool.server.tool_parsers import PARSER_NAMES

    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="the model to serve, as --model takes it (give one of the two)")
    group = parser.add_argument_group("API")
    group.add_argument("--api-key", dest="api_keys", action="append", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on every /v1/* route (401 otherwise); repeat "
                       "for several keys; /health, /ping, /metrics, /version and /tokenize stay open")
    group.add_argument("--chat-template", default=None, metavar="PATH_OR_STRING",
                       help="a Jinja chat template (a file, or the template itself) that replaces the model's "
                       "own, for /v1/chat/completions and /tokenize with messages")
    group.add_argument("--tool-call-parser", default="auto", choices=PARSER_NAMES,
                       help="the format the model writes tool calls in: hermes (Qwen2/Qwen3, Hermes, and the "
                       "fallback prompt), llama3_json, mistral, qwen3_coder (Qwen3-Coder's XML); auto (default): "
                       "from the chat template and the vocabulary")
    group.add_argument("--default-chat-template-kwargs", type=template_kwargs_arg, default=None, metavar="JSON",
                       help='template variables every chat gets unless it sets them in chat_template_kwargs, as a '
                       'JSON object (e.g. \'{"enable_thinking": false}\'); each one the chat template must read')
    group.add_argument("--reasoning-parser", default="auto", choices=REASONING_PARSERS,
                       help="tell a chat reply's reasoning (<think>...</think>) apart from its answer, as "
                       "message.reasoning: qwen3 or deepseek_r1 (one format, vLLM's two names); auto (default): "
                       "when the chat template writes <think> and the vocabulary has its tokens; none: all content")


def resolve_api_args(args: argparse.Namespace) -> str | None:
    """Puts the positional MODEL into args.model (ValueError when --model names another) and returns the
    chat template's source (None: the model's own)."""
    tag = getattr(args, "model_tag", None)
    if tag is not None:
        if args.model is not None and args.model != tag:
            raise ValueError(f"the model is given twice, as MODEL {tag!r} and as --model {args.model!r}: "
                             "give one")
        args.model = tag
    if getattr(args, "chat_template", None) is None:
        return None
    from graphpool.server.chat_template import load_chat_template

    return load_chat_template(args.chat_template)


def chat_options_from_args(args: argparse.Namespace) -> ChatOptions:
    """The ChatOptions `serve`'s flags give (after `resolve_api_args`)."""
    return ChatOptions(getattr(args, "chat_template_source", None), getattr(args, "tool_call_parser", "auto"),
                       getattr(args, "reasoning_parser", "auto"), getattr(args, "default_chat_template_kwargs", None)
                       or {})


def _byte_size(value: str) -> int:
    from graphpool.engine.values import parse_bytes

    try:
        size = parse_bytes(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {value!r}")
    return size


DESCRIPTION = (
    "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics) over the engine"
)


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """`graphpool serve ...` (registered by graphpool.cli)."""
    from graphpool.engine.args import add_engine_args

    p = sub.add_parser("serve", help="run the OpenAI-compatible server", description=DESCRIPTION)
    add_server_args(p)
    add_api_args(p)
    add_engine_args(p)
    p.set_defaults(func=run_serve)


def build_parser() -> argparse.ArgumentParser:
    from graphpool.engine.args import add_engine_args

    parser = argparse.ArgumentParser(prog="python -m graphpool.server", description=DESCRIPTION)
    add_server_args(parser)
    add_api_args(parser)
    add_engine_args(parser)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    if args.device != "cpu" and os.path.exists("/proc/driver/nvidia"):  # before torch's import, to overlap it
        from graphpool.kernels._dispatch import prefetch_triton_cache_key

        prefetch_triton_cache_key()
    from graphpool.engine.args import engine_config_from_args

    try:
        args.chat_template_source = resolve_api_args(args)
        config = engine_config_from_args(args)
        if args.shutdown_timeout < 0:
            raise ValueError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    except ValueError as e:  # a bad flag value, with EngineConfig's reason
        print(f"graphpool serve: {e}", file=sys.stderr)
        return 2
    return serve(args, config)


def make_server(
    engine: Any,
    host: str,
    port: int,
    served_model_name: str | None = None,
    log_level: str = "info",
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
    on_ready: Callable[[], None] | None = None,
    disabled_kernels: Sequence[str] = (),
    max_request_bytes: int | None = None,
    api_keys: Sequence[str] = (),
    chat: ChatOptions | None = None,
    event_loop: str = "auto",
):
    """A GracefulServer (uvicorn.Server) for ``engine`` (an LLMEngine); ``server.run()`` blocks;
    ``begin_shutdown()`` (or SIGTERM) drains and stops it, ``should_exit`` stops it without draining.
    `disabled_kernels`: the engine config's, for /metrics; `event_loop`: uvicorn's loop ("auto": uvloop where it
    imports, else asyncio's)."""
    import uvicorn

    from graphpool.server.app import build_app
    from graphpool.server.async_engine import AsyncEngine
    from graphpool.server.lifecycle import GracefulServer
    from graphpool.server.metrics import ServerMetrics

    # NOTE: a test's stand-in engine may have no start-up times
    metrics = ServerMetrics(disabled_kernels=disabled_kernels, startup=getattr(engine, "startup", None))
    async_engine = AsyncEngine(engine, observer=metrics)
    app = build_app(async_engine, metrics, served_model_name, max_request_bytes, api_keys, chat or DEFAULT_CHAT)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, loop=event_loop)
    return GracefulServer(config, async_engine, shutdown_timeout, on_ready)


@contextlib.contextmanager
def serve_in_thread(
    engine: Any,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    log_level: str = "warning",
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
    max_request_bytes: int | None = None,
    api_keys: Sequence[str] = (),
    chat: ChatOptions | None = None,
    event_loop: str = "auto",
) -> Iterator[tuple[str, Any]]:
    """Serves ``engine`` from a background thread on a free port; yields (base URL, GracefulServer).

    For tests and benchmarks: the caller must not touch ``engine`` until the block exits.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    try:
        server = make_server(engine, host, port, served_model_name, log_level, shutdown_timeout,
                             max_request_bytes=max_request_bytes, api_keys=api_keys, chat=chat, event_loop=event_loop)
    except BaseException:
        sock.close()
        raise
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="graphpool-http", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see the log above)")
            time.sleep(0.02)
        yield f"http://{host}:{port}", server
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


def serve(args: argparse.Namespace, config: Any = None) -> int:
    """Takes the port, loads the engine (``config``, or the one the flags in ``args`` give) and serves until
    a signal; returns the exit status (2: the port is taken, found before the model loads)."""
    from graphpool.engine.args import engine_config_from_args
    from graphpool.engine.engine import LLMEngine
    from graphpool.server.lifecycle import (
        PortInUseError,
        bind_socket,
        seconds_since_process_start,
        startup_heap,
    )
    from graphpool.server.startup_log import describe_startup

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config if config is not None else engine_config_from_args(args)
    try:
        sock = bind_socket(args.host, args.port)
    except PortInUseError as e:
        print(f"graphpool serve: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    name = args.served_model_name

    def ready() -> None:
        logger.info("serving %s on http://%s:%d/v1 (ready %.1f s after process start)", name, args.host, args.port,
                    seconds_since_process_start())

    try:
        with startup_heap():  # NOTE: the server's objects too: refused chat options leave nothing frozen
            engine = LLMEngine(config, defer_graph_warmup=not args.graph_warmup_before_ready)
            name = name or engine.model_name
            try:
                server = make_server(
                    engine, args.host, args.port, args.served_model_name, args.log_level, args.shutdown_timeout,
                    ready, config.disabled_kernels, args.max_request_bytes, getattr(args, "api_keys", None) or (),
                    chat_options_from_args(args),
                )
            except ValueError:  # chat options the model cannot take (--reasoning-parser, template variables)
                engine.close()
                raise
    except ValueError as e:  # a setting the model refuses (e.g. tensor_parallel_size over its heads)
        sock.close()
        print(f"graphpool serve: {e}", file=sys.stderr)
        return 2
    for line in describe_startup(engine, config, time.perf_counter() - start):
        logger.info(line)
    logger.info(engine.startup.describe())
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()  # NOTE: stops the other tensor-parallel ranks (a no-op with one)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_serve(build_parser().parse_args(argv))
