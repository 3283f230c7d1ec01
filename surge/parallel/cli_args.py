"""The parallelism flags of `surge serve` and `surge generate`."""

from __future__ import annotations

import argparse
from typing import Any


def pipeline_parallel_size(value: str) -> int:
    """An argparse type for vLLM's ``-pp``: 1 (its default, no pipeline), the one size Surge runs.

    Raises:
        argparse.ArgumentTypeError: not an integer, or another size (argparse's one line names the flag).
    """
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if size != 1:
        raise argparse.ArgumentTypeError(
            f"Surge has no pipeline parallelism, only 1 is taken (got {size}): shard the model with -tp N"
        )
    return size


def positive_seconds(value: str) -> int:
    """An argparse type for vLLM's ``--distributed-timeout-seconds``: a whole number of seconds
    above 0 (vLLM's int).

    Raises:
        argparse.ArgumentTypeError: not an integer, or not above 0.
    """
    try:
        seconds = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {value!r}") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, got {seconds}")
    return seconds


def device_ids(value: str) -> list[int | str]:
    """An argparse type for vLLM's ``--device-ids``: a comma list of GPU indices (or UUIDs, kept
    as text for :func:`serve_device` to refuse), as vLLM splits it.

    Raises:
        argparse.ArgumentTypeError: an empty list or item.
    """
    items = [part.strip() for part in value.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"a comma list of GPU indices such as 2,3, got {value!r}")
    return [int(item) if item.isdigit() else item for item in items]


def serve_device(args: argparse.Namespace) -> str:
    """The ``--device`` of the engine config, with vLLM's ``--device-ids`` taken where Surge can
    place its ranks on those GPUs: consecutive indices ``a, a+1, ...`` (into the GPUs
    ``CUDA_VISIBLE_DEVICES`` leaves, as in vLLM) give ``cuda:a``, from which replica ``d``'s rank
    ``r`` uses GPU ``a + d * ranks_per_node + r`` (:func:`surge.parallel.launch.rank_device`),
    i.e. vLLM's logical GPU ``i`` is ``ids[i]``.

    Raises:
        ValueError: one line naming ``--device-ids``: duplicates, UUIDs, indices that are not
            consecutive (``CUDA_VISIBLE_DEVICES`` picks any set), fewer GPUs than ``-tp`` x ``-dp``
            need on this host, or ``--device cpu``.
    """
    ids = getattr(args, "device_ids", None)
    if not ids:
        return str(args.device)
    given = ",".join(map(str, ids))
    where = f"--device-ids {given}"
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: a GPU is named twice")
    if not all(isinstance(i, int) for i in ids):
        raise ValueError(
            f"{where}: Surge takes GPU indices, not UUIDs; set CUDA_VISIBLE_DEVICES={given} and leave --device-ids out"
        )
    first = int(ids[0])
    if ids != list(range(first, first + len(ids))):
        raise ValueError(
            f"{where}: Surge runs its ranks on consecutive GPUs; set CUDA_VISIBLE_DEVICES={given} and leave "
            "--device-ids out"
        )
    ranks = args.tensor_parallel_size // max(args.nnodes, 1) * args.data_parallel_size
    if len(ids) < ranks:
        raise ValueError(
            f"{where}: names {len(ids)} GPU(s), but -tp {args.tensor_parallel_size} -dp {args.data_parallel_size} "
            f"run {ranks} rank(s) on this host"
        )
    if args.device == "cpu":
        raise ValueError(f"{where}: not with --device cpu")
    return f"cuda:{first}"


def distributed_executor_backend(value: str) -> str:
    """An argparse type for vLLM's ``--distributed-executor-backend``: ``mp``, how Surge runs its
    tensor-parallel workers (processes it spawns itself).

    Raises:
        argparse.ArgumentTypeError: another backend (ray, uni, external_launcher, ...).
    """
    if value != "mp":
        raise argparse.ArgumentTypeError(
            f"only mp is taken (got {value!r}): Surge spawns its tensor-parallel workers as processes "
            "itself (vLLM's mp), with no Ray"
        )
    return value


def add_parallel_args(p: argparse.ArgumentParser, *, serve: bool) -> None:
    """Add ``-tp`` and vLLM's ``-pp 1`` and ``--distributed-executor-backend mp`` (taken, as they
    ask for what Surge does); with ``serve`` also ``-dp`` and the multi-host flags."""
    p.add_argument(
        "-tp",
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="shard the model over this many GPUs (worker processes; on CPU, processes) (default 1)",
    )
    p.add_argument(
        "--tp-all-reduce",
        choices=("auto", "nccl"),
        default="nccl",
        help="tensor-parallel all-reduce: nccl, or auto (decode-sized tensors through a peer-memory "
        "one-shot all-reduce where the GPUs allow it, NCCL for the rest; measured 3 %% slower per "
        "decode step on two H200s) (default nccl)",
    )
    p.add_argument(
        "-pp",
        "--pipeline-parallel-size",
        type=pipeline_parallel_size,
        default=1,
        help="vLLM's flag, taken as 1 only: Surge has no pipeline parallelism (shard with -tp N) (default 1)",
    )
    p.add_argument(
        "--distributed-executor-backend",
        type=distributed_executor_backend,
        default="mp",
        help="vLLM's flag, taken as mp only: the tensor-parallel workers are processes Surge spawns "
        "(no Ray) (default mp)",
    )
    if not serve:
        return
    p.add_argument(
        "-dp",
        "--data-parallel-size",
        type=int,
        default=1,
        help="engine replicas behind this server, each with its own -tp GPUs (default 1)",
    )
    p.add_argument(
        "--device-ids",
        type=device_ids,
        default=None,
        metavar="IDS",
        help="vLLM's flag: the GPUs to run on, consecutive indices such as 2,3 (into those "
        "CUDA_VISIBLE_DEVICES leaves); replica d's rank r uses the (d x -tp + r)-th (default: from GPU 0)",
    )
    p.add_argument(
        "-dpl",
        "--data-parallel-size-local",
        type=int,
        default=None,
        help="vLLM's flag: the replicas on this host, taken when it equals -dp (Surge runs every replica "
        "on the API server's host) (default: -dp's value)",
    )
    p.add_argument("--nnodes", "-n", type=int, default=1, help="hosts the -tp ranks span (default 1)")
    p.add_argument(
        "--node-rank",
        "-r",
        type=int,
        default=0,
        help="this host's index; 0 runs the server, others only workers (default 0)",
    )
    p.add_argument(
        "--master-addr",
        default="127.0.0.1",
        help="address of node 0 (torch.distributed TCP store and step broadcast)",
    )
    p.add_argument(
        "--master-port",
        type=int,
        default=None,
        help="TCP store port on --master-addr; the next two ports carry steps and results "
        "(required with --nnodes > 1; default: a free port)",
    )
    p.add_argument(
        "--distributed-timeout-seconds",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="vLLM's flag: how long the tensor-parallel ranks (-tp above 1) wait for each other in "
        "torch.distributed.init_process_group, which also bounds each collective (default: 600, NCCL's)",
    )


def check_data_parallel_size_local(args: argparse.Namespace) -> None:
    """Take vLLM's ``--data-parallel-size-local`` (``-dpl``) when it is not given or equals
    ``-dp``: Surge runs every replica on the API server's host, so any other count asks for
    replicas on other hosts (vLLM's multi-node data parallelism).

    Raises:
        ValueError: another value (one line naming the flag and ``-dp``'s value).
    """
    local = getattr(args, "data_parallel_size_local", None)
    if local is None or local == args.data_parallel_size:
        return
    raise ValueError(
        f"--data-parallel-size-local {local} with -dp {args.data_parallel_size}: Surge runs every replica "
        f"on this host, so it takes only -dp's value ({args.data_parallel_size}) or none"
    )


def parallel_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``build_engine_config`` keyword arguments of the parsed flags.

    Raises:
        ValueError: a ``--data-parallel-size-local`` other than ``-dp``
            (:func:`check_data_parallel_size_local`).
    """
    check_data_parallel_size_local(args)
    out: dict[str, Any] = {
        "tensor_parallel_size": args.tensor_parallel_size,
        "tp_all_reduce": args.tp_all_reduce,
    }
    names = (
        "data_parallel_size",
        "nnodes",
        "node_rank",
        "master_addr",
        "master_port",
        "distributed_timeout_seconds",
    )
    for name in names:
        if hasattr(args, name):
            out[name] = getattr(args, name)
    return out
