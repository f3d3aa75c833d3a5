"""Rank stubs for the control-plane harness: one process hosting hundreds of simulated ranks.

Each simulated rank is a thread that does what a rank does on the control path, with the
project's own code and nothing else: it connects to the run's store (``RunStore.connect``),
opens its liveness connection (``hello.announce``), starts the real ``Heartbeat`` over a
``GenerationWatch``, marks itself warm, waits for a plan (``plans.wait_for``), joins
(``plans.join``), "trains" (sleeps a step, times it with the real ``StepTimer``, checks for a
pause where the run is elastic), and when the heartbeat releases it (a newer plan) reports the
collective's failure (``liveness.report``) and waits for the next plan. No torch training.

The harness (``benchmarks/control_plane.py``) drives it through stdin, one JSON object a line:
``{"op": "start", "slot", "env"}`` (the supervisor spawned a slot), ``{"op": "kill", "slot"}``
(the supervisor killed it), ``{"op": "kill-node", "node"}`` (the node is lost: its ranks stop and
their connections close, nothing is reported), ``{"op": "hang", "slot"}`` (its heartbeat stops),
``{"op": "slow", "node", "factor"}``. It answers on stdout: ``{"exit": slot, "rc"}`` and one
``{"join": ...}`` record per rank and generation, which the harness checks (each rank released
once per generation, never in two at once).

    python benchmarks/control_plane_stubs.py   # started by the harness, not by hand
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH: the harness may point that at another tree

from benchmarks.control_plane_run import count_store_requests, requests_so_far  # noqa: E402
from resilience.agent.heartbeat import GenerationWatch, Heartbeat  # noqa: E402
from resilience.agent.step_timer import StepTimer  # noqa: E402
from resilience.contract import run_secret  # noqa: E402
from resilience.contract.messages import Plan, RecoveryInfo, Report, RunStats  # noqa: E402
from resilience.contract.rank_env import RankEnv  # noqa: E402
from resilience.contract.run_store import RunStore  # noqa: E402

try:  # the rank's hello (in liveness.py in older trees: measured too)
    from resilience.contract.hello import announce
except ImportError:
    from resilience.contract.liveness import announce  # type: ignore[attr-defined,no-redef]
try:  # the control channel over the liveness connection (absent from older trees: measured too)
    from resilience.contract.link import RankLink
except ImportError:
    RankLink = None  # type: ignore[assignment,misc]

STEPS_AFTER_FAULT = int(os.environ.get("SRES_STUB_STEPS_AFTER", "4"))
"""Steps a generation after the first trains before every rank reports done."""
STEP_S = float(os.environ.get("SRES_STUB_STEP_S", "0.5"))

_out_lock = threading.Lock()
_starting = threading.BoundedSemaphore(int(os.environ.get("SRES_STUB_STARTING", "16")))
"""Ranks of this host connecting at once: hundreds of threads starting together starved each other
of the GIL past the liveness server's 10 s hello limit (real ranks are processes of their own)."""


_said: list[dict[str, Any]] = []
SAY_EVERY_S = 0.02
"""Records go out in batches this often: thousands of stubs each writing and flushing a line the
moment they join loaded the cores the join barrier was measured on (a record carries the times
it reports, so when it goes out changes no figure)."""


def say(record: dict[str, Any]) -> None:
    with _out_lock:
        _said.append(record)


def _say_out() -> None:
    while True:
        time.sleep(SAY_EVERY_S)
        _flush()


def _flush() -> None:
    with _out_lock:
        records, _said[:] = list(_said), []
    if records:
        sys.stdout.write("".join(json.dumps(r) + "\n" for r in records))
        sys.stdout.flush()


class Released:
    """What the watch shuts down when a newer plan ends the generation: a real rank's gloo
    sockets; here the event the stub's step waits on, so it is released at once."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.at = 0.0
        """When the heartbeat released it (0: not released)."""

    def shutdown(self) -> int:
        self.at = time.time()
        self.event.set()
        return 0


class StubRank:
    """One simulated rank: the control path of ``resilience.agent.rank_loop.Agent``."""

    def __init__(self, env: RankEnv, slow: dict[int, float]) -> None:
        self.env, self.slow = env, slow
        self.stopped = threading.Event()
        self.frozen = threading.Event()
        self.link: socket.socket | None = None
        self.rank_link: Any = None
        self.reported_t = 0.0
        self.heartbeat: Heartbeat | None = None
        self.released = Released()
        self.thread = threading.Thread(target=self._life, name=env.slot, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """The process is gone: its threads stop, its connections close."""
        self.stopped.set()
        self.released.event.set()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.link is not None:
            try:
                self.link.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.link.close()

    def kill(self) -> None:
        """The supervisor killed the process: it stops, and its exit is seen."""
        if not self.stopped.is_set():
            self.stop()
            say({"exit": self.env.slot, "rc": -9})

    def hang(self) -> None:
        """The process is stuck (holding the GIL, or stopped): its heartbeat stops and its main
        thread sends nothing more (a step record would prove it alive); the connection stays."""
        self.frozen.set()
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def _life(self) -> None:
        env = self.env
        try:
            with _starting:
                store, watch = self._connect()
            self._generations(store, watch)
        except Exception as err:  # noqa: BLE001 - a stub that fails says so and exits as a rank would
            if not self.stopped.is_set():
                say({"error": env.slot, "message": f"{type(err).__name__}: {err}"})
                say({"exit": env.slot, "rc": 1})
            return
        if not self.stopped.is_set():
            self.stop()
            say({"exit": env.slot, "rc": 0})

    def _connect(self) -> tuple[RunStore, GenerationWatch]:
        """What ``Agent.__init__`` and the start of ``Agent.run`` do: the store, the liveness
        connection, the heartbeat, warm."""
        env = self.env
        key = run_secret.store_key(env.run_secret, env.store_nonce)
        store = RunStore.connect(env.store_host, env.store_port, key)
        # The heartbeat's own connection before the hello, as Agent.__init__ makes it (older trees:
        # Heartbeat clones it itself, after).
        beats = store.clone() if "own" in inspect.signature(Heartbeat).parameters else None
        self.link = announce(env.store_host, env.liveness_port, env.slot, env.run_secret)
        watch = GenerationWatch()
        link: Any = self.link
        if RankLink is not None:  # as Agent.__init__ does
            link = self.rank_link = RankLink(self.link, env.run_secret, env.slot)
            store.plans.notices = link.notices
            if hasattr(link, "wrote"):  # older trees read the reports' counter every tick
                store.liveness.doorbell = store.events.doorbell = link.wrote
        if beats is not None:
            self.heartbeat = Heartbeat(store, beats, env.slot, env.heartbeat_s, watch, link)
        else:
            older: Any = Heartbeat
            self.heartbeat = older(store, env.slot, env.heartbeat_s, watch, link)
        self.heartbeat.start()
        gc.freeze()  # as Agent.run does before it marks itself warm
        store.liveness.mark_ready(env.slot, time.time())
        return store, watch

    def _generations(self, store: RunStore, watch: GenerationWatch) -> None:
        generation = 0
        while not self.stopped.is_set():
            plan = store.plans.wait_for(self.env.slot, generation)
            if plan is None or self.stopped.is_set():
                return
            generation = plan.generation
            arrived = time.time()
            steps = {"released": self.released.at, "reported": self.reported_t}
            watch.joining = plan.generation
            joined = store.plans.join(plan, self.env.reform_timeout_s)
            watch.joining = 0
            say(
                {
                    "join": self.env.slot,
                    "generation": generation,
                    "arrived": arrived,
                    "joined": time.time(),
                    "ok": joined,
                    **steps,
                }
            )
            if joined and self._generation(store, watch, plan):
                return

    def _generation(self, store: RunStore, watch: GenerationWatch, plan: Plan) -> bool:
        """Train in ``plan``'s generation; True when the run is done."""
        rank = plan.rank_of(self.env.slot)
        assert rank is not None
        self.released = Released()
        watch.enter(plan.generation, "gloo", self.released, [])  # type: ignore[arg-type]
        more: dict[str, Any] = {"link": self.rank_link} if self.rank_link is not None else {}
        if "every_s" in inspect.signature(StepTimer).parameters:  # older trees: every 5 steps
            more["every_s"] = self.env.heartbeat_s
        if "window" in inspect.signature(StepTimer).parameters:  # older trees: a record per step
            from resilience.contract.messages import record_window

            more["window"] = record_window(plan.world_size)
        timer = StepTimer(store, self.env.slot, plan.generation, **more)
        first = store.progress.step() or 0
        if rank == 0:
            now = time.time()
            store.progress.publish_recovery(plan.generation, RecoveryInfo(first, "self", 0, 0.0, now, now))
        done = self._steps(store, plan, rank, timer, first)
        if self.stopped.is_set():
            return True
        # A stub has nothing to tear down: it leaves before it reports (hundreds of stubs share a
        # process and its GIL; a real rank reports first, then takes its time to tear down).
        watch.release_now(plan.generation)
        watch.leave()
        watch.left()
        if done:
            timer.publish()
            if rank == 0:
                store.progress.publish_stats(plan.generation, RunStats(STEP_S))
            store.liveness.report(plan.generation, self.env.slot, Report("done", rank, digest="stub"))
        else:
            report = Report(
                "error",
                rank,
                message="RuntimeError: Connection closed by peer (a stub's collective)",
                collateral=True,
                origin="released",
                error_type="RuntimeError",
            )
            store.liveness.report(plan.generation, self.env.slot, report)
        self.reported_t = time.time()
        return done

    def _steps(self, store: RunStore, plan: Plan, rank: int, timer: StepTimer, step: int) -> bool:
        """Steps until released (False) or, after the first generation, until done (True)."""
        last = step + STEPS_AFTER_FAULT if plan.generation > 1 else None
        elastic = self.env.elastic is not None and self.env.elastic.elastic
        first = True
        while last is None or step < last:
            if elastic and self._pause_before(store, plan, step + 1):
                return False
            timer.step_started()
            if self.released.event.wait(STEP_S * self.slow.get(self.env.node, 1.0)):
                return False
            if self.frozen.is_set():  # hung: nothing more until the supervisor kills it
                self.stopped.wait()
                return False
            step += 1
            timer.step_committed(step)
            if rank == 0:
                store.progress.set_step(step)
                if first:
                    store.progress.mark_first_step(plan.generation, time.time())
            first = False
        return True

    def _pause_before(self, store: RunStore, plan: Plan, step: int) -> bool:
        """As the commit pipeline asks (every few steps at scale, where the tree has that)."""
        try:
            from resilience.contract.channels.plans import pause_check_every
        except ImportError:
            return store.plans.pause_before(plan.generation, step)
        return store.plans.pause_before(plan.generation, step, pause_check_every(plan.world_size))


def main() -> None:
    threading.stack_size(512 * 1024)  # hundreds of threads a host: keep their reserved stacks small
    # Hundreds of threads share this process's GIL, each needing it briefly between two blocking
    # calls: a long slice lets each finish that work without being preempted (a forced switch
    # among hundreds of runnable threads costs more than the work: at a 1 ms slice a recovery of
    # 1,024 stubs took 31 s of two cores; real ranks are processes and never contend).
    sys.setswitchinterval(float(os.environ.get("SRES_STUB_SWITCH_S", "0.05")))
    count_store_requests()
    # A rank still in an ended generation 2 s after its release ends itself: one process each in a
    # real run. Here hundreds share one GIL, and waking them all at once may take longer.
    Heartbeat.RELEASE_GRACE_S = 300.0
    threading.Thread(target=_say_out, name="say", daemon=True).start()
    ranks: dict[str, StubRank] = {}
    slow: dict[int, float] = {}
    for line in sys.stdin:
        order = json.loads(line)
        op = order["op"]
        if op == "start":
            env = RankEnv.from_environ(order["env"])
            assert env is not None
            ranks[env.slot] = StubRank(env, slow)
            ranks[env.slot].start()
        elif op == "kill" and order["slot"] in ranks:
            # In a thread: stopping waits for the rank's heartbeat thread, and orders keep coming.
            threading.Thread(target=ranks[order["slot"]].kill, daemon=True).start()
        elif op == "kill-node":
            for rank in [r for r in ranks.values() if r.env.node == order["node"]]:
                rank.stop()
        elif op == "hang":
            ranks[order["slot"]].hang()
        elif op == "count":
            say({"count": requests_so_far()})
        elif op == "slow":
            slow[int(order["node"])] = float(order["factor"])
    for rank in ranks.values():
        rank.stop()
    _flush()


if __name__ == "__main__":
    main()
