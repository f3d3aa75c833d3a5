import pytest

from launcher.slurm.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    "expression, hosts",
    [
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("a[01-03],b7,c[9-11]", ["a01", "a02", "a03", "b7", "c9", "c10", "c11"]),
        ("gpu-node", ["gpu-node"]),
        ("n[09-10]", ["n09", "n10"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("n1,n1,n2", ["n1", "n2"]),
        (" n[1-2] , m3 ", ["n1", "n2", "m3"]),
    ],
)
def test_expand(expression, hosts):
    assert expand(expression) == hosts


@pytest.mark.parametrize(
    "expression",
    [
        "a[01-03],b7,c[9-11]",
        "n[1-3,7]",
        "n[09-10]",
        "n[9-10]",
        "x",
        "n[001-003,010]",
        "n[1-2]-ib",
        "gpu[1-4],cpu[01-02],login",
    ],
)
def test_round_trip(expression):
    hosts = expand(expression)
    assert compress(hosts) == expression
    assert expand(compress(hosts)) == hosts


def test_compress_sorts_and_merges():
    assert compress(["n3", "n1", "n2", "n10", "m1"]) == "n[1-3,10],m1"


def test_padding_is_kept_apart():
    # n1 and n01 are different hosts; n9 and n010 cannot share a range.
    assert sorted(expand(compress(["n1", "n01"]))) == ["n01", "n1"]
    assert expand(compress(["n9", "n010"])) == ["n9", "n010"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ("n[3-1", "unclosed '['"),
        ("", "empty hostlist"),
        ("   ", "empty hostlist"),
        ("n[3-1]", "descending range"),
        ("n[]", "empty brackets"),
        ("n[a-b]", "bad range"),
        ("n]", "unmatched ']'"),
        ("a,,b", "empty host name"),
        ("n[[1]]", "nested '['"),
        ("n[0-99999999999]", "too large"),
    ],
)
def test_bad_expressions_raise_clear_errors(bad, message):
    with pytest.raises(HostlistError, match=message.replace("[", r"\[").replace("]", r"\]")):
        expand(bad)


def test_compress_rejects_bad_names():
    with pytest.raises(HostlistError):
        compress([])
    with pytest.raises(HostlistError):
        compress(["n[1]"])
