"""StaticInputs on CPU: input checks, buffers sized once, copy-in with padding, views, inference_mode."""

from __future__ import annotations

import pytest
import torch

from graphpool.pool.inputs import InputSpec, StaticInputs

SPECS = (InputSpec("ids", (), torch.int64, 7), InputSpec("x", (2,), torch.float32, -1.0))


def test_write_copies_live_rows_and_pads_the_rest_of_the_bucket_only() -> None:
    st = StaticInputs(SPECS, 1, "cpu")
    st.allocate(8)
    st.buffers[0]["ids"].fill_(99)  # stale rows from an earlier, larger step
    (mb,), rows = st.check({"ids": torch.tensor([1, 2, 3]), "x": torch.ones(3, 2)})
    assert rows == [3]
    st.write([mb], rows, 5)
    assert st.buffers[0]["ids"].tolist() == [1, 2, 3, 7, 7, 99, 99, 99]
    assert st.buffers[0]["x"][3:5].eq(-1.0).all() and st.buffers[0]["x"][:3].eq(1.0).all()
    (view,) = st.views(5)
    assert view["ids"].shape == (5,) and view["ids"].data_ptr() == st.buffers[0]["ids"].data_ptr()
    st.pad(8)
    assert st.buffers[0]["ids"].tolist() == [7] * 8


def test_check_refuses_wrong_microbatches_keys_and_shapes() -> None:
    st = StaticInputs(SPECS, 2, "cpu")
    ok = {"ids": torch.zeros(2, dtype=torch.int64), "x": torch.zeros(2, 2)}
    with pytest.raises(ValueError, match="2 microbatch"):
        st.check(ok)
    with pytest.raises(ValueError, match="keys"):
        st.check([ok, {"ids": torch.zeros(2, dtype=torch.int64)}])
    with pytest.raises(ValueError, match="shape"):
        st.check([ok, {"ids": torch.zeros(2, dtype=torch.int64), "x": torch.zeros(3, 2)}])
    assert st.check([ok, ok])[1] == [2, 2]
    assert st.buffers == []  # checking needs no buffers (graphs off)
    with pytest.raises(ValueError, match="at least one"):
        StaticInputs((), 1, "cpu")


def test_buffers_built_under_inference_mode_take_copies_outside_it() -> None:
    st = StaticInputs(SPECS, 1, "cpu")
    with torch.inference_mode():
        st.allocate(4)
    assert not st.buffers[0]["ids"].is_inference()
    mbs, rows = st.check({"ids": torch.tensor([5]), "x": torch.zeros(1, 2)})
    st.write(mbs, rows, 2)
    assert st.buffers[0]["ids"][:2].tolist() == [5, 7]
    st.free()
    assert st.buffers == []


WIDE = (InputSpec("table", (4,), torch.int32, 0), InputSpec("ids", (), torch.int64, 7),
        InputSpec("flag", (), torch.bool, True))


def test_staged_write_sends_live_rows_and_padding_in_one_block() -> None:
    """The host path (on CUDA: a pinned mirror, one copy): every buffer's rows [0, size) hold the live rows then
    the pad value, through more writes than mirrors, and the widest buffer lies last in the block."""
    st = StaticInputs(WIDE, 1, "cpu", stage_host=True)
    st.allocate(8)
    assert st.buffers[0]["ids"].tolist() == [7] * 8 and st.buffers[0]["flag"].all()
    block = st.buffers[0]["table"].untyped_storage().data_ptr()
    assert st.buffers[0]["table"].data_ptr() > st.buffers[0]["ids"].data_ptr() >= block
    for step, (r, size) in enumerate([(3, 4), (8, 8), (1, 2), (5, 8), (2, 2), (6, 8)]):
        mb = {"table": torch.arange(r * 4, dtype=torch.int32).view(r, 4) + step,
              "ids": torch.arange(r) + 100 * step, "flag": torch.zeros(r, dtype=torch.bool)}
        (got,), rows = st.check(mb)
        st.write([got], rows, size)
        buf = st.buffers[0]
        assert buf["ids"][:size].tolist() == [100 * step + i for i in range(r)] + [7] * (size - r)
        assert buf["table"][:r].equal(mb["table"]) and buf["table"][r:size].eq(0).all()
        assert buf["flag"][:size].tolist() == [False] * r + [True] * (size - r)


def test_staged_write_leaves_the_widest_buffer_past_the_bucket_alone() -> None:
    st = StaticInputs(WIDE, 1, "cpu", stage_host=True)
    st.allocate(8)
    st.buffers[0]["table"].fill_(-5)  # rows a larger bucket wrote
    mbs, rows = st.check({"table": torch.ones(1, 4, dtype=torch.int32), "ids": torch.tensor([1]),
                          "flag": torch.tensor([False])})
    st.write(mbs, rows, 2)
    assert st.buffers[0]["table"][:, 0].tolist() == [1, 0, -5, -5, -5, -5, -5, -5]
