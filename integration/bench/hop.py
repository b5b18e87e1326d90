"""A bare TCP hop, the floor under any proxy: what one more process between client and broker costs
when it does nothing per byte in Python.

Each accepted connection is paired with one to the target and forwarded both ways by two threads
that loop on blocking splice(2) through a kernel pipe (socket -> pipe -> socket): the bytes never
enter the process, and the threads wait in the kernel with the GIL released. No Kafka is spoken:
a Kafka client reaches the broker through the hop only if the broker advertises the hop's address
(``passthrough --hop`` gives the broker a second listener that does). Linux only.

    python -m integration.bench.hop LISTEN_PORT TARGET_HOST:TARGET_PORT

prints ``ready`` once it listens and forwards until it is killed.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: Bytes one pipe holds (F_SETPIPE_SZ; fs.pipe-max-size caps it at 1 MiB by default), and so the
#: most one splice moves: as much as the proxy's own splice pipes.
PIPE_BYTES = 1 << 20


def pump(source: socket.socket, sink: socket.socket, done: threading.Barrier) -> None:
    """Move bytes from `source` to `sink` until `source` ends or either side fails, then shut both
    down so that the pump of the other direction ends too; the pump that ends last closes them."""
    read_fd, write_fd = os.pipe()
    try:
        try:
            fcntl.fcntl(read_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # a smaller pipe still forwards, in smaller moves
        while taken := os.splice(source.fileno(), write_fd, PIPE_BYTES, flags=os.SPLICE_F_MOVE):
            while taken:
                taken -= os.splice(read_fd, sink.fileno(), taken, flags=os.SPLICE_F_MOVE)
    except OSError:
        pass  # a reset on either side ends this direction like an end of stream does
    finally:
        os.close(read_fd)
        os.close(write_fd)
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if done.wait() == 0:  # both directions are over: nothing splices on these sockets any more
            source.close()
            sink.close()


def forward(client: socket.socket, target: tuple[str, int]) -> None:
    """Pair `client` with a new connection to `target` and pump both directions on threads of their own."""
    try:
        upstream = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for end in (client, upstream):
        end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Kafka's and the proxy's sockets
    done = threading.Barrier(2)
    for source, sink in ((client, upstream), (upstream, client)):
        threading.Thread(target=pump, args=(source, sink, done), daemon=True).start()


def serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        client, _ = listener.accept()
        forward(client, target)


@contextmanager
def hop_process(listen_port: int, target: str) -> Iterator[subprocess.Popen[bytes]]:
    """This module as a process of its own (so that its CPU is its own), forwarding
    127.0.0.1:`listen_port` to `target` from when it is ready until the block ends."""
    process = subprocess.Popen([sys.executable, "-m", "integration.bench.hop", str(listen_port), target],
                               stdout=subprocess.PIPE, cwd=_PROJECT_ROOT)  # where `integration` is importable
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the bare hop on port {listen_port} did not start (exit code {process.poll()})")
        yield process
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    host, _, port = arguments[1].rpartition(":")
    listener = socket.create_server(("127.0.0.1", int(arguments[0])), backlog=512)
    print("ready", flush=True)
    serve(listener, (host, int(port)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
