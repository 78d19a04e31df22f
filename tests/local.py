"""Addresses on this machine for tests of servers and clients."""

from __future__ import annotations

import socket


def closed_port_url() -> str:
    """An OpenAI-style base URL on a port that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
