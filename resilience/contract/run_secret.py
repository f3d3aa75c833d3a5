"""The run's secret: what proves that a connection comes from one of the run's own processes.

Another user on the node sees the supervisor's ports (``/proc/net/tcp``) and can connect to
them; what they cannot read is a process's environment (``/proc/PID/environ`` is its user's
and root's only). So the supervisor makes a secret (128 bits from the OS), hands it to its ranks
in ``SRES_RUN_SECRET``, and writes it nowhere else: no file, log line, event or command line.
A connection proves it by answering a fresh challenge with an HMAC: the secret never crosses the
wire, and an answer seen once is worth nothing on the next connection.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

ENV = "SRES_RUN_SECRET"
"""Where a rank finds it."""
SECRET_BYTES = 16
_HEX = re.compile(r"[0-9a-f]{32,128}")


def new_secret() -> str:
    return secrets.token_hex(SECRET_BYTES)


def new_challenge() -> str:
    return secrets.token_hex(16)


def is_secret(text: str) -> bool:
    """A secret as :func:`new_secret` makes them (lower-case hex, at least 128 bits)."""
    return _HEX.fullmatch(text) is not None


def proof(secret: str, challenge: str, *parts: str) -> str:
    """The answer to ``challenge`` for a message of ``parts``: HMAC-SHA256 under the secret."""
    message = "\0".join((challenge, *parts)).encode()
    return hmac.new(bytes.fromhex(secret), message, hashlib.sha256).hexdigest()


def verify(secret: str, challenge: str, answer: str, *parts: str) -> bool:
    """Whether ``answer`` is :func:`proof` of ``parts`` (in constant time)."""
    return hmac.compare_digest(proof(secret, challenge, *parts), answer)
