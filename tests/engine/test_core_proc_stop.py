"""The engine process's stop signals: the first leaves the loop, later ones do nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zmq

from surge.config import EngineConfig, ModelConfig, SchedulerConfig
from surge.engine.core_proc import STOP_SIGNAL, _Shutdown, _StopSignals, run_engine_core


def _refuse(config: EngineConfig) -> None:
    """An engine factory that refuses the model, as a missing tensor does."""
    raise ValueError("model: refused by the test")


def test_the_first_stop_raises_and_later_ones_do_nothing() -> None:
    stops = _StopSignals(os.getppid())
    stops.on_sigterm(15, None)  # the parent is alive: SIGTERM is ignored
    assert not stops.stopping
    with pytest.raises(_Shutdown):
        stops.on_stop(int(STOP_SIGNAL), None)
    assert stops.stopping
    stops.on_stop(int(STOP_SIGNAL), None)  # a second stop during the clean-up: nothing
    orphan = _StopSignals(parent_pid=-1)  # SIGTERM once the parent is gone is a stop
    with pytest.raises(_Shutdown):
        orphan.on_sigterm(15, None)
    orphan.on_sigterm(15, None)


def test_a_stop_signal_during_the_clean_up_after_a_refused_start_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API process answers a start-up error with STOP_SIGNAL. A signal that lands while the
    engine process switches its handlers off in the clean-up must not raise there (it escaped
    the clean-up with a traceback, found by CI). Run in this process, with the stop delivered
    exactly there: when the clean-up sets SIGTERM to SIG_IGN."""
    import signal as signal_module

    import surge.engine.core_proc as core_proc

    handlers: dict[int, object] = {}
    delivered: list[int] = []

    def fake_signal(signum: int, handler: object) -> object:
        stop = handlers.get(int(STOP_SIGNAL))
        if handler is signal_module.SIG_IGN and signum == signal_module.SIGTERM and callable(stop):
            delivered.append(int(STOP_SIGNAL))
            stop(int(STOP_SIGNAL), None)  # the stop signal arrives right here
        handlers[int(signum)] = handler
        return signal_module.SIG_DFL

    monkeypatch.setattr(signal_module, "signal", fake_signal)  # no real handler is installed
    monkeypatch.setattr(core_proc, "set_parent_death_signal", lambda: None)
    ctx = zmq.Context()
    to_engine = ctx.socket(zmq.PUSH)
    from_engine = ctx.socket(zmq.PULL)
    to_engine.bind(f"ipc://{tmp_path}/in")
    from_engine.bind(f"ipc://{tmp_path}/out")
    config = EngineConfig(
        model=ModelConfig.from_pretrained(None), scheduler=SchedulerConfig(max_model_len=64)
    )
    try:
        with pytest.raises(SystemExit) as exit_info:
            run_engine_core(config, f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out", os.getpid(), _refuse, 30)
        assert from_engine.poll(5_000)  # the start-up error reached the API side
    finally:
        to_engine.close(linger=0)
        from_engine.close(linger=0)
        ctx.term()
    assert exit_info.value.code == 2
    assert delivered == [int(STOP_SIGNAL)]
