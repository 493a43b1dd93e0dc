"""Mooncake transport against a real master (TCP, P2PHANDSHAKE): data, lifetime, errors."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from br_serve.transport.base import KVHandle, TransportError
from br_serve.transport.mooncake import MooncakeTransport, parse_address
from br_serve.transport.mooncake_master import MooncakeMaster, free_port

from .conftest import needs_mooncake

pytestmark = needs_mooncake

SEG = 64 * 1024**2


def _transport(addr: str) -> MooncakeTransport:
    return MooncakeTransport(addr, global_segment_size=SEG, local_buffer_size=16 * 1024**2)


def test_roundtrip_between_two_clients(mooncake_master: str) -> None:
    kv = {"keys": torch.randn(2, 2, 7, 16, dtype=torch.bfloat16),
          "values": torch.randn(2, 2, 7, 16)}
    with _transport(mooncake_master) as writer, _transport(mooncake_master) as reader:
        h = writer.put("rt-1", kv)
        assert h.nbytes > kv["keys"].numel() * 2 + kv["values"].numel() * 4
        got = reader.get(h)
        assert got["keys"].dtype == torch.bfloat16
        assert torch.equal(got["keys"], kv["keys"])
        assert torch.equal(got["values"], kv["values"])
        # the emulated engine's payload: a uint8 array
        arr = np.arange(1000, dtype=np.uint8)
        np.testing.assert_array_equal(reader.get(writer.put("rt-2", arr)), arr)
        reader.release(h)
        assert not reader.exists("rt-1")
        reader.release(h)  # idempotent: an already removed key is fine
        with pytest.raises(TransportError, match="-704"):
            reader.get(h)


def test_key_vanishes_when_writer_closes(mooncake_master: str) -> None:
    with _transport(mooncake_master) as reader:
        writer = _transport(mooncake_master)
        h = writer.put("life-1", np.ones(4096, dtype=np.uint8))
        assert reader.exists("life-1")
        writer.close()
        assert not reader.exists("life-1")
        with pytest.raises(TransportError, match="OBJECT_NOT_FOUND"):
            reader.get(h)
        with pytest.raises(TransportError, match="closed"):
            writer.put("life-2", b"x")


def test_size_mismatch_is_an_error(mooncake_master: str) -> None:
    with _transport(mooncake_master) as t:
        h = t.put("size-1", np.ones(100, dtype=np.uint8))
        bad = KVHandle(transport="mooncake", key="size-1", nbytes=h.nbytes + 1)
        with pytest.raises(TransportError, match="handle says"):
            t.get(bad)
        with pytest.raises(TransportError, match="objref"):
            t.get(KVHandle(transport="objref", key="size-1", nbytes=h.nbytes))


def test_put_larger_than_segment_fails_with_code(mooncake_master: str) -> None:
    with MooncakeTransport(mooncake_master, global_segment_size=16 * 1024**2,
                           local_buffer_size=16 * 1024**2) as t:
        with pytest.raises(TransportError, match=r"put 'big' .* code -"):
            t.put("big", np.ones(32 * 1024**2, dtype=np.uint8))
        assert not t.exists("big")


def test_setup_failure_is_a_transport_error(mooncake_master: str) -> None:
    # Mooncake refuses segments under 16 MiB: setup returns a code, we raise.
    with pytest.raises(TransportError, match=r"setup with master .* failed: code"):
        MooncakeTransport(mooncake_master, global_segment_size=4 * 1024**2)


def test_master_down_fails_fast() -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(TransportError, match=f"127.0.0.1:{port} is not reachable"):
        MooncakeTransport(f"127.0.0.1:{port}", connect_timeout_s=2.0)
    assert time.monotonic() - t0 < 10.0


def test_master_env_and_bad_address(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("MOONCAKE_MASTER", f"127.0.0.1:{port}")
    with pytest.raises(TransportError, match=str(port)):
        MooncakeTransport(connect_timeout_s=1.0)
    with pytest.raises(ValueError, match="master_address"):
        MooncakeTransport("no-port-here")
    assert parse_address("10.0.0.1:50051") == ("10.0.0.1", 50051)


def test_master_helper_reports_early_exit() -> None:
    with pytest.raises(RuntimeError, match="exited"):
        MooncakeMaster(extra_args=("--no_such_flag_xyz",), ready_timeout_s=20).start()


def test_concurrent_gets_from_threads(mooncake_master: str) -> None:
    # The decode replica pulls KV with asyncio.to_thread: several gets may overlap.
    from concurrent.futures import ThreadPoolExecutor

    with _transport(mooncake_master) as writer, _transport(mooncake_master) as reader:
        handles = [writer.put(f"conc-{i}", np.full(256 * 1024, i, dtype=np.uint8))
                   for i in range(8)]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(reader.get, handles))
        for i, arr in enumerate(got):
            assert arr.shape == (256 * 1024,) and int(arr.min()) == int(arr.max()) == i
        for h in handles:
            reader.release(h)
        assert not any(reader.exists(h.key) for h in handles)
