"""Free TCP ports on 127.0.0.1."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
