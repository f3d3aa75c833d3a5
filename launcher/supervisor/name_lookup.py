"""Is this machine's nameserver fit for torch's store? Say so at the run's start when it is not.

torch's ``TCPStore`` looks up the *name* of the address at both ends of every new connection
(``getnameinfo`` without ``NI_NUMERICHOST``): the client of the address it connects to, in its
IPv6 form (an IPv4 address as ``::ffff:a.b.c.d``, which ``/etc/hosts`` lines in IPv4 form do not
answer), the server of each peer, on its one thread. A nameserver that drops the query costs
glibc's timeout (5 s, twice with the default two attempts) per connection: every rank's start and
every replacement waits that long, and while the server waits every other rank's request does
too. Nothing in the run can avoid the lookups; an admin can answer them locally. So the run asks
once, on a thread of its own, and a slow answer becomes one warning line that says what to do.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

SLOW_S = 0.5
"""A lookup answered from ``/etc/hosts`` or a local cache takes well under a millisecond; a
nameserver on the network a few. Half a second per connection is already seconds per recovery."""


@dataclass(frozen=True)
class Lookup:
    """One reverse lookup as torch's client makes it: what was asked, how long it took, and what
    came back (a name, or the error glibc gave)."""

    address: str
    seconds: float
    answer: str


def client_form(host: str) -> str:
    """The address torch's store client asks the name of: its socket prefers IPv6 and resolves
    with ``AI_V4MAPPED``, so an IPv4 address is asked as ``::ffff:a.b.c.d``."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name: what the client resolves it to, as it does
        flags = socket.AI_V4MAPPED | socket.AI_ALL
        infos = socket.getaddrinfo(host, None, socket.AF_INET6, socket.SOCK_STREAM, 0, flags)
        return str(infos[0][4][0])
    return f"::ffff:{address}" if address.version == 4 else str(address)


def look_up(address: str, clock: Callable[[], float] = time.monotonic) -> Lookup:
    """Ask as torch does: a name if there is one, else the address itself ("no such name"
    answered at once is a fast, fine answer: only the time matters)."""
    started = clock()
    try:
        answer = socket.getnameinfo((address, 0), socket.NI_NUMERICSERV)[0]  # torch's flags
    except OSError as err:  # glibc's EAI_AGAIN after its timeout: torch only warns and goes on
        answer = f"{type(err).__name__}: {err}"
    return Lookup(address, clock() - started, answer)


def warning(lookup: Lookup, store_host: str, slow_s: float = SLOW_S) -> str | None:
    """The line to say for ``lookup`` (None: fast enough to say nothing)."""
    if lookup.seconds < slow_s:
        return None
    return (
        f"warning: a reverse name lookup of {lookup.address} (the store's address {store_host}, as "
        f"ranks connect to it) took {lookup.seconds:.1f} s ({lookup.answer}). torch's store makes "
        "one at both ends of every connection, the server one at a time, so each rank's start and "
        "each replacement waits about that long. Answer them locally: list the nodes in /etc/hosts, "
        f"their ::ffff: forms too (e.g. '{lookup.address} <name>'), or run nscd or "
        "systemd-resolved (docs/explanation/scale.md, 'Name lookups')"
    )


def watch(store_host: str, say: Callable[[str], None], slow_s: float = SLOW_S) -> threading.Thread:
    """Ask once, on a daemon thread (a dropped query would hold up the run's start for seconds),
    and :func:`say` the warning if the answer was slow. Returns the thread (tests join it)."""

    def ask() -> None:
        try:
            found = look_up(client_form(store_host))
            line = warning(found, store_host, slow_s)
        except (OSError, ValueError) as err:  # a name that does not resolve (or cannot: IDNA)
            line = f"warning: could not resolve the store's address {store_host}: {err}"
        if line is not None:
            try:
                say(line)
            except ValueError:  # the run has ended and closed its output: a late answer is moot
                pass

    thread = threading.Thread(target=ask, name="sres-name-lookup", daemon=True)
    thread.start()
    return thread
