"""``share-proxy serve``: run the proxy until SIGTERM/SIGINT.

Prints exactly one line to stdout, ``ready bootstrap=HOST:PORT``, once every
listener is open; everything else goes to the log on stderr.
"""

from __future__ import annotations

import argparse
import signal
import sys

import structlog
import trio

from proxy.config import ProxyConfig, configure_parser, load_config
from proxy.errors import ConfigError, ProxyError
from proxy.logging import configure_logging
from proxy.server import Proxy


def configure(parser: argparse.ArgumentParser) -> None:
    configure_parser(parser)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(f"share-proxy serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_json)
    log = structlog.get_logger("proxy.serve")
    if config.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(config.metrics_port, addr=config.listen.host)
        log.info("metrics", port=config.metrics_port)
    try:
        trio.run(serve, config)
    except BaseExceptionGroup as group:
        failures, rest = group.split(ProxyError)
        if rest is not None:
            raise
        for error in failures.exceptions:
            log.error("proxy failed", error=str(error))
        return 1
    except ProxyError as error:
        log.error("proxy failed", error=str(error))
        return 1
    return 0


async def serve(config: ProxyConfig) -> None:
    proxy = Proxy(config)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            bootstrap = await nursery.start(proxy.run)
            print(f"ready bootstrap={bootstrap}", flush=True)
            async for signum in signals:
                structlog.get_logger("proxy.serve").info("signal", signal=signal.Signals(signum).name)
                proxy.shutdown()
                break
