"""The typed JSON that ranks gather before a recovery (resilience.state.gather): what each rank
holds and each tier offers goes through as it was, and anything else is refused in one line."""

from __future__ import annotations

import json

import pytest

from resilience.errors import Unrecoverable
from resilience.state.gather import decoded, from_json, to_json
from resilience.state.recovery_plan import Holdings
from resilience.tiers.base import Offer
from resilience.tiers.restore import Failure


def wire(value):
    """What a peer's JSON reads as on this side."""
    return json.loads(json.dumps(value))


def test_holdings_and_offers_cross_as_they_were():
    holdings = Holdings(
        3,
        own=(7, 8),
        shards=(8,),
        replicas={2: (7, 8), -1: ()},
        sharded=True,
        shard_world=4,
        shard_rank=3,
        twins=(1,),
        ranked=(8,),
        rank_replicas={0: (8,)},
        rank_world=4,
    )
    assert from_json(Holdings, wire(to_json(holdings)), "holdings") == holdings
    offer = Offer("ram", 1, 2, 40, 4, interchangeable=True, per_rank=False, generation=3)
    assert from_json(Offer, wire(to_json(offer)), "an offer") == offer


@pytest.mark.parametrize(
    "change",
    [
        {"rank": True},  # JSON true is no int here
        {"rank": "3"},
        {"rank": 3.0},
        {"own": [7, "8"]},
        {"own": 7},
        {"replicas": {"07": [1]}},  # not how json.dumps writes an int key
        {"replicas": {" 7": [1]}},
        {"replicas": [[7, [1]]]},
        {"sharded": 1},
        {"extra": 1},
    ],
)
def test_a_field_of_another_type_or_name_is_refused(change):
    data = {**wire(to_json(Holdings(3, own=(7,)))), **change}
    with pytest.raises(Unrecoverable, match="holdings from rank 3"):
        from_json(Holdings, data, "holdings from rank 3")


def test_missing_fields_and_other_shapes_are_refused():
    data = wire(to_json(Holdings(3)))
    del data["twins"]
    for bad in (data, [], "holdings", None):
        with pytest.raises(Unrecoverable, match="not the fields of Holdings"):
            from_json(Holdings, bad, "holdings")


def test_tier_failures_are_checked_before_a_plan_skips_them():
    failure = Failure("ram", 1, 40, "bad checksum")
    assert from_json(Failure, wire(to_json(failure)), "a tier restore failure") == failure
    good = wire(to_json(failure))
    for bad in (
        ["ram", 1, 40, "bad checksum"],
        {"tier": "ram"},
        {**good, "owner": "1"},
        {**good, "step": True},
        {**good, "why": None},
    ):
        with pytest.raises(Unrecoverable, match="from rank 1"):
            from_json(Failure, bad, "a tier restore failure from rank 1")


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x04\x95",  # a pickle's first bytes
        b"[1, NaN]",
        b"\xff\xfe",
        b"[" * 100_000 + b"]" * 100_000,  # nesting past the recursion limit
        b"{",
    ],
)
def test_what_is_not_json_is_refused_in_one_line(data):
    with pytest.raises(Unrecoverable, match="holdings from rank 2 is not JSON"):
        decoded(data, "holdings from rank 2")
