"""One JSON line per check result or action, to a log file and to syslog.

A log that cannot be written must never fail a hook: a full /var/log would otherwise drain
the cluster. In a container without /dev/log, syslog messages are dropped by libc quietly.
"""

from __future__ import annotations

import json
import sys
import syslog
import time
from pathlib import Path
from typing import Any

_LEVEL = {
    "ok": syslog.LOG_INFO,
    "skipped": syslog.LOG_INFO,
    "fail": syslog.LOG_ERR,
    "timeout": syslog.LOG_ERR,
    "error": syslog.LOG_ERR,
    "warning": syslog.LOG_WARNING,
}


class HealthLog:
    """Writes events for one hook run; ``base`` fields (hook, node, job) go on every line."""

    def __init__(self, file: str | None, use_syslog: bool, **base: Any) -> None:
        self.file = Path(file) if file else None
        self.use_syslog = use_syslog
        self.base = {k: v for k, v in base.items() if v is not None}
        self._warned = False
        if use_syslog:
            syslog.openlog("sres-hooks", syslog.LOG_PID, syslog.LOG_DAEMON)

    def event(self, event: str, **fields: Any) -> None:
        record = {"ts": round(time.time(), 3), "event": event, **self.base, **fields}
        line = json.dumps(record, sort_keys=False)
        if self.file is not None:
            try:
                self.file.parent.mkdir(parents=True, exist_ok=True)
                with open(self.file, "a") as out:
                    out.write(line + "\n")
            except OSError as err:
                if not self._warned:
                    print(
                        f"sres: warning: cannot write {self.file} ({err.strerror}); logging to stderr",
                        file=sys.stderr,
                    )
                    self._warned = True
                print(line, file=sys.stderr)
        if self.use_syslog:
            level = _LEVEL.get(str(fields.get("status", event)), syslog.LOG_NOTICE)
            try:
                syslog.syslog(level, line)
            except OSError:
                pass

    def close(self) -> None:
        if self.use_syslog:
            syslog.closelog()
