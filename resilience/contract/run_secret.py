"""The run's secret: what proves that a connection comes from one of the run's own processes.

Another user on the node sees the supervisor's ports (``/proc/net/tcp``) and can connect to
them; what they cannot read is a process's environment (``/proc/PID/environ`` is its user's
and root's only). So the supervisor makes a secret (128 bits from the OS), hands it to its ranks
in ``SRES_RUN_SECRET``, and writes it nowhere else but one 0600 file in the run's private log
dir (:func:`kept_in`, for a requeued job): no log line, event or command line.
A connection proves it by answering a fresh challenge with an HMAC: the secret never crosses the
wire, and an answer seen once is worth nothing on the next connection.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from resilience.contract.own_file import read_own
from resilience.contract.run_dir import SECRET, RunDir

ENV = "SRES_RUN_SECRET"
"""Where a rank finds it."""
SECRET_BYTES = 16
_HEX = re.compile(r"[0-9a-f]{32,128}")


def new_secret() -> str:
    return secrets.token_hex(SECRET_BYTES)


KEPT = SECRET
"""The name of the file in the (private, 0700) log dir that keeps the secret for the job's next
incarnation (:attr:`RunDir.secret`)."""


def kept_in(log_dir: Path) -> str:
    """The run's secret, kept in its log dir: a requeued job (same log dir) gets the one its
    first incarnation made, so what was named after it (a private RAM root, see
    ``resilience.tiers.layout.ram_root``) is found again. Made and written 0600 when there is
    none; a file there that is a link, not the user's or not a secret is replaced, never used."""
    path = RunDir(Path(log_dir)).secret
    try:
        text, mode = read_own(path, 256)
        if not mode & 0o077 and is_secret(text):
            return text
    except OSError:  # a link or another user's file (NotPrivate) included
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    secret = new_secret()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret)
    return secret


def new_challenge() -> str:
    return secrets.token_hex(16)


def is_secret(text: str) -> bool:
    """A secret as :func:`new_secret` makes them (lower-case hex, at least 128 bits)."""
    return _HEX.fullmatch(text) is not None


def proof(secret: str, challenge: str, *parts: str) -> str:
    """The answer to ``challenge`` for a message of ``parts``: HMAC-SHA256 under the secret."""
    message = "\0".join((challenge, *parts)).encode()
    return hmac.new(bytes.fromhex(secret), message, hashlib.sha256).hexdigest()


def store_key(secret: str, nonce: str) -> str:
    """The key the run's store values are signed under for one incarnation of the supervisor
    (``nonce``: fresh at each start, in the ranks' environment). The secret outlives a requeue
    (the log dir keeps it), so a value signed under it alone stayed valid in the next run of the
    same log dir: a ``plan/2`` copied from one run into the next made it form the first one's
    membership."""
    return proof(secret, nonce, "store")


def verify(secret: str, challenge: str, answer: str, *parts: str) -> bool:
    """Whether ``answer`` is :func:`proof` of ``parts`` (in constant time)."""
    return hmac.compare_digest(proof(secret, challenge, *parts), answer)
