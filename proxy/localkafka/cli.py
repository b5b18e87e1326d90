"""`share-proxy local-kafka`: run a local single-node Apache Kafka until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from types import FrameType

from proxy.localkafka.broker import DEFAULT_VERSION, LocalKafka
from proxy.localkafka.errors import LocalKafkaError
from proxy.localkafka.jars import cache_root


class _Shutdown(BaseException):
    """Raised from the signal handler so a start in progress unwinds through stop()."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kafka-version",
        default=os.environ.get("KSP_KAFKA_VERSION", DEFAULT_VERSION),
        help="Apache Kafka release to run (jars from Maven Central, cached); env KSP_KAFKA_VERSION",
    )
    parser.add_argument("--port", type=int, default=0, help="client port on 127.0.0.1 (PLAINTEXT, or the --security listener); 0 picks a free one")
    parser.add_argument("--controller-port", type=int, default=0, help="KRaft controller port; 0 picks a free one")
    parser.add_argument(
        "--share-groups",
        action="store_true",
        help="enable Kafka's own (native) share groups, 4.x only; by default they are off so the proxy provides them",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="keep logs and KRaft storage here and reuse them on the next start; default: a temporary directory removed at exit",
    )
    parser.add_argument("--heap", default="512m", help="broker JVM maximum heap (-Xmx)")
    parser.add_argument(
        "--security",
        choices=("none", "sasl_ssl", "sasl_plaintext"),
        default="none",
        help="secure the client listener: SASL over TLS (generated CA and certificates) or SASL without TLS; "
        "SCRAM-SHA-512 users admin (super user), alice and bob with password NAME-secret, ACLs enforced "
        "by the StandardAuthorizer; OAUTHBEARER is offered too, with Kafka's unsecured test validator",
    )
    parser.epilog = (
        f"Prints one line 'ready bootstrap=127.0.0.1:PORT version=V' on stdout when the broker answers; "
        f"with --security it adds ' ca=<CA certificate PEM> client-config=<Kafka client properties for admin>' "
        f"(sasl_plaintext has no TLS and prints no ca=). Jar cache: {cache_root()} (env KSP_KAFKA_CACHE)."
    )


def ready_line(kafka: LocalKafka) -> str:
    """`ready bootstrap=HOST:PORT version=V`, plus ` ca=PATH client-config=PATH` when secured."""
    line = f"ready bootstrap={kafka.bootstrap} version={kafka.version}"
    if kafka.ca_path is not None:
        line += f" ca={kafka.ca_path}"
    if kafka.client_config_path is not None:
        line += f" client-config={kafka.client_config_path}"
    return line


def _raise_shutdown(signum: int, frame: FrameType | None) -> None:
    raise _Shutdown(signum)


def run(args: argparse.Namespace) -> int:
    try:
        kafka = LocalKafka(
            version=args.kafka_version,
            share_groups=args.share_groups,
            data_dir=args.data_dir,
            port=args.port,
            controller_port=args.controller_port,
            heap=args.heap,
            security=None if args.security == "none" else args.security,
        )
    except LocalKafkaError as error:
        print(f"local-kafka: {error}", file=sys.stderr)
        return 2
    previous = {sig: signal.signal(sig, _raise_shutdown) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        kafka.start()
        print(ready_line(kafka), flush=True)
        print(f"local-kafka: data {kafka.data_dir}, log {kafka.log_path}; stop with Ctrl-C or SIGTERM", file=sys.stderr, flush=True)
        code = kafka.wait()
        print(f"local-kafka: broker exited on its own with code {code}; log {kafka.log_path}:\n{kafka.log_tail()}", file=sys.stderr)
        return 1
    except _Shutdown:
        return 0
    except LocalKafkaError as error:
        print(f"local-kafka: {error}", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C must not interrupt the clean stop.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        was_running = kafka.running
        kafka.stop()
        if was_running:
            outcome = "killed (it ignored SIGTERM)" if kafka.killed else "stopped"
            print(f"local-kafka: broker {outcome}", file=sys.stderr, flush=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
