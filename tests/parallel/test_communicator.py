"""The TP all-reduce: its choice of path, and the flag that picks it."""

from __future__ import annotations

import pytest
import torch

from surge.config import ParallelConfig
from surge.layers.embedding import VocabParallelEmbedding
from surge.layers.linear import RowParallelLinear
from surge.parallel.communicator import TPCommunicator, attach_communicator


def test_cpu_uses_torch_distributed_and_layers_get_it() -> None:
    comm = TPCommunicator(torch.device("cpu"), hidden_size=8, dtype=torch.float32, max_rows=4)
    assert not comm.one_shot
    model = torch.nn.Sequential(
        VocabParallelEmbedding(16, 8, tp_rank=0, tp_size=2),
        RowParallelLinear(8, 8, tp_rank=0, tp_size=2),
        torch.nn.Linear(8, 8),
    )
    assert attach_communicator(model, comm) == 2
    assert model[0].comm is comm and model[1].comm is comm


def test_nccl_method_never_builds_peer_buffers() -> None:
    comm = TPCommunicator(torch.device("cpu"), 8, torch.float32, 4, method="nccl")
    assert not comm.one_shot and comm._bufs == []


def test_config_refuses_an_unknown_all_reduce() -> None:
    assert ParallelConfig(all_reduce="nccl").all_reduce == "nccl"
    with pytest.raises(ValueError, match="all_reduce"):
        ParallelConfig(all_reduce="ring")
