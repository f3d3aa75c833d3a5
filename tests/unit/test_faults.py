import pytest

from resilience.agent.faults import due
from resilience.contract.injections import InjectSpecError, parse


def test_parse_every_kind():
    specs = parse(
        [
            "kill:rank=1:step=5",
            "node:2:step=7",
            "raise:rank=0:step=3",
            "hang:rank=3:step=4",
            "kill-during-commit:rank=2:step=9",
            "node:1:gen=2",
            "kill:rank=0:gen=3",
            "kill-during-copy:rank=1:step=6",
            "kill-during-capture:rank=2:step=3",
            "stall-capture:rank=0:step=2",
        ]
    )
    assert [s.spec for s in specs] == [
        "kill:rank=1:step=5",
        "node:2:step=7",
        "raise:rank=0:step=3",
        "hang:rank=3:step=4",
        "kill-during-commit:rank=2:step=9",
        "node:1:gen=2",
        "kill:rank=0:gen=3",
        "kill-during-copy:rank=1:step=6",
        "kill-during-capture:rank=2:step=3",
        "stall-capture:rank=0:step=2",
    ]
    assert [s.index for s in specs] == list(range(10))


@pytest.mark.parametrize(
    "bad, words",
    [
        ("explode:rank=1:step=2", "unknown kind 'explode'"),
        ("kill:rank=x:step=2", "bad form"),
        ("kill:step=2", "bad form"),
        ("node:1", "bad form"),
        ("raise:rank=1:gen=2", "gen= works with kill and node only"),
        ("node:1:gen=1", "gen >= 2"),
    ],
)
def test_bad_specs_name_the_spec(bad, words):
    with pytest.raises(InjectSpecError) as info:
        parse([bad])
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_due_matches_rank_node_step_and_generation():
    specs = parse(["kill:rank=1:step=5", "node:2:step=5", "node:2:gen=3"])
    assert [i.spec for i in due(specs, step=5, rank=1, node=0, kinds=["kill", "node"])] == [
        "kill:rank=1:step=5"
    ]
    assert [i.spec for i in due(specs, step=5, rank=0, node=2, kinds=["kill", "node"])] == ["node:2:step=5"]
    assert [i.spec for i in due(specs, generation=3, rank=0, node=2, kinds=["node"])] == ["node:2:gen=3"]
    assert due(specs, step=4, rank=1, node=2, kinds=["kill", "node"]) == []


def test_fill_disk_takes_every_free_byte_of_a_small_filesystem_and_refuses_a_big_one(tmp_path, monkeypatch):
    from resilience.agent import faults as f

    monkeypatch.setattr(f, "FILL_LIMIT_BYTES", 0)  # tmp_path is on a real disk: refused, untouched
    assert f.fill_disk(tmp_path / "filler").startswith("not filled")
    assert not (tmp_path / "filler").exists()


@pytest.mark.local  # spawns: the rank the fault kills
def test_kill_all_does_not_wait_for_a_rank_that_an_earlier_fault_took():
    """Found by the 500-fault soak: a kill at the kill-all's step took one rank before it got
    there, and the others waited for it past their generation's end (then exited 75)."""
    import subprocess
    import sys
    import time

    child = (
        "import torch.distributed as dist\n"
        "from resilience.agent import faults\n"
        "from resilience.contract.run_store import RunStore\n"
        "store = RunStore(dist.HashStore())\n"
        "from resilience.contract.messages import Plan\n"
        "store.plans.publish(Plan(2, 1, {0: 'the next generation'}, {}, 1))\n"
        "from resilience.contract.injections import parse\n"
        "faults.fire(parse(['kill-all:step=3'])[0], store, 0, 0, 4, generation=1)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    assert time.monotonic() - started < 30  # not the 60 s arrival deadline


def _example(syntax: str) -> str:
    """The first spec a kind's syntax line shows, with numbers in place of its letters."""
    first = syntax.split(" | ")[0].split(" (")[0]
    first = first.replace("=R", "=1").replace("=S", "=4").replace("=F", "=2").replace(":N:", ":1:")
    return first.replace("=D", "=3").replace("=M", "=20").replace("=P", "=5")


def test_every_registered_kind_parses_from_the_syntax_it_declares_and_prints_back_the_same():
    from resilience.contract.injections import FAULT_KINDS

    examples = [_example(kind.syntax) for kind in FAULT_KINDS.values()]
    parsed = parse(examples)
    assert [i.kind for i in parsed] == list(FAULT_KINDS)
    assert [i.spec for i in parsed] == examples


def test_inject_help_lists_every_kind_with_its_spec_and_who_performs_it(capsys):
    from launcher.cli.parser import main
    from resilience.contract.injections import FAULT_KINDS

    for argv in (["run", "--inject", "help"], ["run", "--inject", "--help"], ["srun", "--inject", "-h"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        listing = capsys.readouterr().out
        for kind in FAULT_KINDS.values():
            assert f"  {kind.syntax} " in listing and f"{kind.doc} [{kind.performer}]" in listing, kind.name


def test_a_bad_form_of_a_known_kind_names_that_kind_s_syntax():
    with pytest.raises(InjectSpecError) as info:
        parse(["slow:rank=1:step=3"])
    assert str(info.value).endswith("use slow:rank=R:factor=F:step=S")


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("cut:1:mbit=3:step=2", "use cut:N:for=D:step=S"),
        ("slow-link:1:for=3:step=2", "use slow-link:N:mbit=M:step=S"),
        ("slow-link:1:mbit=0:step=2", "mbit must be positive"),
        ("flap:1:for=0:step=2", "a flap lasts for=D > 0 seconds"),
        ("lossy:1:ms=3:step=2", "use lossy:N:percent=P:step=S"),
        ("lossy:1:percent=100:step=2", "percent must be above 0 and below 100"),
        ("delay:1:ms=0:step=2", "ms must be positive"),
    ],
)
def test_a_link_fault_takes_its_own_option_in_its_own_range(bad, words):
    with pytest.raises(InjectSpecError, match=words):
        parse([bad])


def test_a_link_fault_on_nodes_that_share_one_network_is_refused_before_the_start(tmp_path):
    from launcher.errors import ConfigError
    from launcher.placement.local import LocalPlacement
    from launcher.run.supervise import _links_can_break

    with pytest.raises(ConfigError, match=r"^--inject cut:1:for=0:step=3: network faults need nodes"):
        _links_can_break(parse(["kill:rank=0:step=2", "cut:1:for=0:step=3"]), LocalPlacement(tmp_path))
    _links_can_break(parse(["kill:rank=0:step=2"]), LocalPlacement(tmp_path))  # nothing to break: fine


@pytest.mark.local  # two threads and a wait
def test_node_losses_due_at_one_step_reach_the_supervisor_together():
    """Seen in CI: two node losses at one step, told one by one, let a loaded supervisor re-form
    and recover between them (two faults, where the run meant one). The first node's rank waits
    until the second's has marked its node; the supervisor is told once, and finds both."""
    import threading
    import time

    import torch.distributed as dist

    from resilience.agent.faults import _lose_nodes_together
    from resilience.contract.run_store import RunStore

    store = RunStore(dist.HashStore())
    injections = parse(["node:1:step=6", "node:2:step=6", "node:0:step=9"])
    first = threading.Thread(target=_lose_nodes_together, args=(injections[0], store, 1, 1, injections))
    first.start()
    time.sleep(0.3)
    assert first.is_alive() and store.faults.node_kill_requests() == 0  # node 2's loss is still to come
    _lose_nodes_together(injections[1], store, 2, 1, injections)
    first.join(timeout=5)
    assert not first.is_alive() and store.faults.node_kill_requests() >= 1
    assert [node for node in (0, 1, 2) if store.faults.take_node_kill(node)] == [1, 2]


def test_a_link_fault_counted_but_not_yet_written_is_read_at_the_next_look():
    """Seen in CI: the supervisor read the request counter between a rank's two writes (its
    number, then its spec), took the empty request as seen, and the cut never came."""
    import torch.distributed as dist

    from resilience.contract import keys
    from resilience.contract.run_store import RunStore

    store = RunStore(dist.HashStore())
    number = store.core.add(keys.LINK_FAULTS)  # the rank's first write; its second is still to come
    assert store.faults.link_faults_after(0) == (0, [])
    store.core.put_text(keys.link_fault(number), "cut:1:for=0:step=8")
    store.faults.request_link_fault("flap:0:for=2:step=9")
    assert store.faults.link_faults_after(0) == (2, ["cut:1:for=0:step=8", "flap:0:for=2:step=9"])
    assert store.faults.link_faults_after(2) == (2, [])
