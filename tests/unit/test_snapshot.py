import torch

from resilience.state import snapshot


def states():
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    return (
        model,
        opt,
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "loader": {"epoch": 3, "rng": torch.get_rng_state()},
        },
    )


def test_round_trip_is_exact_and_fresh():
    model, opt, s = states()
    snap = snapshot.capture(s, step=7)
    back = snapshot.materialize(snap)
    assert back["loader"]["epoch"] == 3
    assert torch.equal(back["model"]["weight"], model.weight)
    assert back["model"]["weight"].data_ptr() != snap.buffers["float32"].data_ptr()  # not a view
    fresh = torch.nn.Linear(8, 4)
    fresh_opt = torch.optim.AdamW(fresh.parameters())
    fresh.load_state_dict(back["model"])
    fresh_opt.load_state_dict(back["optimizer"])
    again = snapshot.capture(
        {"model": fresh.state_dict(), "optimizer": fresh_opt.state_dict(), "loader": back["loader"]}, step=7
    )
    assert again.digest() == snap.digest()


def test_buffers_are_reused_and_checksum_sees_one_byte():
    _, _, s = states()
    first = snapshot.capture(s, step=1)
    second = snapshot.capture(s, step=2, reuse=first)
    assert second.buffers["float32"].data_ptr() == first.buffers["float32"].data_ptr()
    before = second.checksum()
    second.buffers["float32"].view(torch.uint8)[5] ^= 1
    assert second.checksum() != before


def test_a_checksum_fed_piece_by_piece_is_the_checksum_of_the_whole():
    tensors = [torch.randn(1000), torch.empty(0), torch.arange(77, dtype=torch.int64)]
    running = snapshot.RunningChecksum(b"skeleton")
    for t in tensors:
        for piece in t.reshape(-1).split(33):
            running.update(piece)
    assert running.value() == snapshot.checksum(b"skeleton", tensors)
    assert running.value() != snapshot.checksum(b"skeleton!", tensors)


def _tied() -> torch.nn.Module:
    """An embedding and a head that share their weight, as GPT-2 and most language models do."""
    embed, head = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50, bias=False)
    head.weight = embed.weight
    return torch.nn.ModuleDict({"embed": embed, "head": head})


def test_tied_weights_are_kept_once_and_come_back_tied(tmp_path):
    """``state_dict`` names a tied weight under both keys: a snapshot, a transfer and a tier file
    carry it once, and a model loading it is as it was."""
    model = _tied()
    snap = snapshot.capture({"model": model.state_dict()}, step=1)
    assert snap.buffers["float32"].numel() == 50 * 16
    assert len(snapshot.describe({"model": model.state_dict()})[1]) == 1
    back = snapshot.materialize(snap)["model"]
    assert back["embed.weight"] is back["head.weight"]
    fresh = _tied()
    fresh.load_state_dict(back)
    assert torch.equal(fresh["head"].weight, model["head"].weight)
    assert fresh["head"].weight is fresh["embed"].weight


def test_views_of_one_storage_that_differ_are_kept_apart():
    base = torch.arange(12.0)
    state = {"a": base[:6], "b": base[6:], "c": base.view(3, 4), "d": base[:6]}
    back = snapshot.materialize(snapshot.capture(state, step=1))
    assert snapshot.capture(state, step=1).buffers["float32"].numel() == 6 + 6 + 12
    assert all(torch.equal(back[k], state[k]) for k in state)
    assert back["a"] is back["d"]
