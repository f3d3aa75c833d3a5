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
