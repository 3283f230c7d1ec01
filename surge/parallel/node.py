"""A host other than node 0: it runs only tensor-parallel workers (no server, no scheduler).

``surge serve --nnodes 2 --node-rank 1 --master-addr A --master-port P -tp 2 ...`` on the
second host starts the workers of its ranks; they join the ``torch.distributed`` TCP store at
``A:P`` and connect to the engine's step broadcast and results on ``A:P+1`` and ``A:P+2``.
The command ends when its workers end: after the engine shuts them down, when the connection
to the engine drops, or on SIGINT / SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from surge.config import EngineConfig
from surge.parallel.launch import endpoints
from surge.parallel.worker import start_worker

logger = logging.getLogger("surge.parallel")


def run_worker_node(config: EngineConfig, log_level: int = logging.INFO) -> int:
    """Run this host's workers until they exit. Returns 0 when all exited cleanly, else 1.

    Raises:
        ValueError: ``node_rank`` is 0 (node 0 runs the server).
    """
    pc = config.parallel
    if pc.node_rank == 0:
        raise ValueError("run_worker_node: node 0 runs the server, not a worker node")
    ep = endpoints(config, None)
    procs = [start_worker(config, rank, ep, parent_pid=None, log_level=log_level) for rank in pc.local_ranks]
    logger.info(
        "node %d of %d: tensor-parallel ranks %s started, engine at %s",
        pc.node_rank,
        pc.nnodes,
        list(pc.local_ranks),
        pc.master_addr,
    )
    stop = False

    def _stop(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop and any(p.is_alive() for p in procs):
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = [p.exitcode for p in procs]
    logger.info("node %d: workers exited with codes %s", pc.node_rank, codes)
    return 0 if all(c == 0 for c in codes) else 1
