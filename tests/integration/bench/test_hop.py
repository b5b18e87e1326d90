"""The bare hop on loopback sockets: bytes both ways, in order and whole, and an end on one side
ends the other."""

from __future__ import annotations

import os
import socket

import pytest

from integration.bench.hop import forward, hop_process
from proxy.localkafka import free_port

pytestmark = pytest.mark.skipif(not hasattr(os, "splice"), reason="the hop splices (Linux only)")


def receive_exactly(end: socket.socket, count: int) -> bytes:
    received = bytearray()
    while len(received) < count:
        chunk = end.recv(count - len(received))
        assert chunk, f"the stream ended after {len(received)} of {count} bytes"
        received += chunk
    return bytes(received)


def test_the_hop_moves_bytes_both_ways_whole_and_in_order_and_passes_an_end_on() -> None:
    with socket.create_server(("127.0.0.1", 0)) as target, socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname()) as client:
            accepted, _ = listener.accept()
            forward(accepted, target.getsockname())
            upstream, _ = target.accept()
            with upstream:
                request = os.urandom(3 << 20)  # more than one pipe's worth
                client.sendall(request)
                assert receive_exactly(upstream, len(request)) == request
                response = os.urandom(100_000)
                upstream.sendall(response)
                assert receive_exactly(client, len(response)) == response
                client.shutdown(socket.SHUT_WR)
                upstream.settimeout(10)
                assert upstream.recv(1) == b""  # the client's end reached the target
                client.settimeout(10)
                assert client.recv(1) == b""  # and the hop let go of the client too


def test_the_hop_process_forwards_once_it_says_ready() -> None:
    with socket.create_server(("127.0.0.1", 0)) as target:
        port = free_port()
        with hop_process(port, "127.0.0.1:%d" % target.getsockname()[1]) as process:
            with socket.create_connection(("127.0.0.1", port)) as client:
                upstream, _ = target.accept()
                with upstream:
                    client.sendall(b"ping")
                    assert receive_exactly(upstream, 4) == b"ping"
        assert process.poll() is not None  # stopped when the block ended
