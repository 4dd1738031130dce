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
