"""Where tensor-parallel ranks run: devices, addresses and ports.

One host (``nnodes == 1``): the step broadcast and the results travel over ``ipc://`` sockets in
a private temporary folder, and the ``torch.distributed`` TCP store listens on a free port of
127.0.0.1 (or ``master_port + 3 * data_parallel_rank``). Several hosts: node 0 binds the store on ``master_port`` and the
broadcast and results on the next two ports of ``master_addr``; every node connects there.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from surge.config import EngineConfig


@dataclass(frozen=True)
class Endpoints:
    """The addresses of one tensor-parallel group.

    Attributes:
        dist_init_method: ``tcp://host:port`` of the ``torch.distributed`` TCP store.
        step_bind, step_connect: the engine's step broadcast (XPUB bind / SUB connect).
        result_bind, result_connect: the engine's result socket (PULL bind / PUSH connect).
    """

    dist_init_method: str
    step_bind: str
    step_connect: str
    result_bind: str
    result_connect: str


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def endpoints(config: EngineConfig, ipc_dir: str | None) -> Endpoints:
    """The addresses of ``config``'s group (``ipc_dir`` is needed on one host only).

    Raises:
        ValueError: one host without ``ipc_dir``.
    """
    pc = config.parallel
    if pc.nnodes == 1:
        if ipc_dir is None:
            raise ValueError("endpoints: one host needs an ipc_dir")
        # Replicas (data parallelism) of one host each get their own store port.
        port = free_port() if pc.master_port is None else pc.master_port + 3 * pc.data_parallel_rank
        step = f"ipc://{ipc_dir}/steps"
        result = f"ipc://{ipc_dir}/results"
        return Endpoints(f"tcp://127.0.0.1:{port}", step, step, result, result)
    assert pc.master_port is not None
    host = pc.master_addr
    return Endpoints(
        dist_init_method=f"tcp://{host}:{pc.master_port}",
        step_bind=f"tcp://*:{pc.master_port + 1}",
        step_connect=f"tcp://{host}:{pc.master_port + 1}",
        result_bind=f"tcp://*:{pc.master_port + 2}",
        result_connect=f"tcp://{host}:{pc.master_port + 2}",
    )


def rank_device(config: EngineConfig, rank: int) -> str:
    """The device of global tensor-parallel ``rank`` on its host: "cpu", or
    ``cuda:<index of config.device + local rank>`` (``config.device`` is the replica's first GPU,
    see :func:`replica_device`)."""
    if config.device == "cpu":
        return "cpu"
    local = rank % config.parallel.ranks_per_node
    return f"cuda:{_device_index(config.device) + local}"


def replica_device(config: EngineConfig, replica: int) -> str:
    """The first device of data-parallel ``replica``: "cpu", or the CUDA device
    ``replica * ranks_per_node`` places after ``config.device``."""
    if config.device == "cpu":
        return "cpu"
    return f"cuda:{_device_index(config.device) + replica * config.parallel.ranks_per_node}"


def _device_index(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0
