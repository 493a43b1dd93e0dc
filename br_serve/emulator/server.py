"""Run an emulator: every port of one config on one event loop (uvicorn servers).

``serve(config)`` blocks (the CLI); :class:`EmulatorThread` runs the same servers on a
background thread and is what in-process tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI

from br_serve.emulator import sglang, vllm
from br_serve.emulator.app import Emulator
from br_serve.emulator.config import EmulatorConfig

T = TypeVar("T")


def build(config: EmulatorConfig) -> tuple[Emulator, list[tuple[int, FastAPI]]]:
    """The emulator state and one app per port (rank ports, then the bootstrap port)."""
    mod = vllm if config.protocol == "vllm" else sglang
    emu = mod.make_emulator(config)
    apps: list[tuple[int, FastAPI]] = []
    if config.port_per_rank:
        apps = [(config.port + g, mod.build_app(emu, g)) for g in range(config.dp_size)]
    else:
        apps = [(config.port, mod.build_app(emu, None))]
    if config.bootstrap_port is not None:
        apps.append((config.bootstrap_port, mod.build_app(emu, None)))
    return emu, apps


def _servers(config: EmulatorConfig, apps: list[tuple[int, FastAPI]],
             log_level: str) -> list[uvicorn.Server]:
    return [uvicorn.Server(uvicorn.Config(app, host=config.host, port=port,
                                          log_level=log_level, lifespan="on",
                                          timeout_graceful_shutdown=1,
                                          access_log=False))
            for port, app in apps]


async def serve_async(config: EmulatorConfig, log_level: str = "warning",
                      on_ready: Callable[[Emulator], None] | None = None,
                      stop: asyncio.Event | None = None) -> Emulator:
    """Serve until every server exits (signal) or ``stop`` is set."""
    emu, apps = build(config)
    servers = _servers(config, apps, log_level)
    tasks = [asyncio.ensure_future(s.serve()) for s in servers]
    while not all(s.started for s in servers):
        if any(t.done() for t in tasks):  # a port could not be bound
            for s in servers:
                s.should_exit = True
            await asyncio.gather(*tasks, return_exceptions=True)
            raise OSError(f"emulator: could not listen on {config.host}:{config.ports()}")
        await asyncio.sleep(0.01)
    if on_ready is not None:
        on_ready(emu)
    # One server leaving (a signal reaches only one of them) or ``stop``: all leave.
    waiter = asyncio.ensure_future((stop or asyncio.Event()).wait())
    await asyncio.wait({waiter, *tasks}, return_when=asyncio.FIRST_COMPLETED)
    for s in servers:
        s.should_exit = True
    waiter.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return emu


class EmulatorThread:
    """An emulator on a daemon thread: ``with EmulatorThread(cfg) as emu: emu.url``."""

    def __init__(self, config: EmulatorConfig, log_level: str = "warning") -> None:
        self.config = config
        self.emulator: Emulator | None = None
        self._log_level = log_level
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"emulator-{config.role}-{config.port}")

    @property
    def url(self) -> str:
        return f"http://{self.config.public_host}:{self.config.port}"

    def rank_url(self, rank: int) -> str:
        return f"http://{self.config.public_host}:{self.config.port + rank}"

    def start(self, timeout_s: float = 10.0) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("emulator did not start")
        if self._error is not None:
            raise self._error
        return self

    def call(self, fn: Callable[[Emulator], object]) -> object:
        """Run ``fn(emulator)`` on the emulator's loop (its state is not thread-safe)."""
        assert self._loop is not None and self.emulator is not None
        emu = self.emulator

        async def run() -> object:
            return fn(emu)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def __enter__(self) -> EmulatorThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(emu: Emulator) -> None:
                self.emulator = emu
                self._ready.set()
            await serve_async(self.config, self._log_level, ready, self._stop)
        try:
            run_loop(run())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
        finally:
            self._ready.set()


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when it is installed (uvicorn's choice too)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def serve(config: EmulatorConfig, log_level: str = "warning",
          on_ready: Callable[[Emulator], None] | None = None) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        run_loop(serve_async(config, log_level, on_ready))
