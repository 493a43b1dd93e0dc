"""KV payload packing: exact round trips, and truncation/corruption never pass silently."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from br_serve.transport.payload import PayloadError, pack_payload, unpack_payload

TORCH_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8)
NP_DTYPES = (np.float32, np.float64, np.int32, np.uint8)

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, dt=st.sampled_from(TORCH_DTYPES), seed=st.integers(0, 2**31),
       npshape=shapes, npdt=st.sampled_from(NP_DTYPES))
def test_dict_roundtrip(shape: list[int], dt: torch.dtype, seed: int, npshape: list[int],
                        npdt: type) -> None:
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g) * 100).to(dt)
    a: np.ndarray = np.random.default_rng(seed).integers(0, 100, size=npshape).astype(npdt)
    back = unpack_payload(pack_payload({"t": t, "a": a, "b": b"xyz"}))
    assert back["t"].dtype == dt and tuple(back["t"].shape) == tuple(shape)
    assert torch.equal(back["t"], t)
    assert back["a"].dtype == a.dtype and back["a"].shape == a.shape
    np.testing.assert_array_equal(back["a"], a)
    assert back["b"] == b"xyz"


def test_single_values_and_non_contiguous() -> None:
    arr = np.arange(10, dtype=np.uint8)
    np.testing.assert_array_equal(unpack_payload(pack_payload(arr)), arr)
    assert unpack_payload(pack_payload(b"hello")) == b"hello"
    t = torch.arange(12.0).view(3, 4).t()  # non-contiguous
    assert torch.equal(unpack_payload(pack_payload(t)), t)
    packed = pack_payload(t)
    assert unpack_payload(packed.tobytes()).shape == (4, 3)


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(1, 400))
def test_truncated_buffer_raises(cut: int) -> None:
    buf = pack_payload({"keys": torch.ones(2, 3, 8), "values": torch.zeros(2, 3, 8)})
    assert buf.size > 400
    with pytest.raises(PayloadError):
        unpack_payload(buf[: buf.size - cut])


def test_corrupt_header_and_bad_types() -> None:
    buf = pack_payload({"k": np.ones(3)})
    bad = buf.copy()
    bad[:8] = 0
    with pytest.raises(PayloadError, match="magic"):
        unpack_payload(bad)
    bad = buf.copy()
    bad[16:20] = ord("}")
    with pytest.raises(PayloadError, match="header"):
        unpack_payload(bad)
    with pytest.raises(TypeError, match="unsupported"):
        pack_payload({"k": [1, 2, 3]})
    with pytest.raises(PayloadError, match="truncated"):
        unpack_payload(b"BRKV")
