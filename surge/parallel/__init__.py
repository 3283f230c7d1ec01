"""Tensor and data parallelism over ``torch.distributed``.

- :mod:`surge.parallel.executor`: ``TPExecutor``, the engine's runner over TP worker processes.
- :mod:`surge.parallel.worker`: a TP rank's process (process group, its shard, the step loop).
- :mod:`surge.parallel.step_codec`: a scheduler step as a msgspec message of deltas, and its
  mirror on the workers.
- :mod:`surge.parallel.messages`: the msgspec structs between the engine and its workers.
- :mod:`surge.parallel.launch`: devices, addresses and ports of ranks.
- :mod:`surge.parallel.node`: a worker-only host of a multi-host group.
- :mod:`surge.parallel.dp_client`: data-parallel replicas behind one API server (routing).
- :mod:`surge.parallel.cli_args`: the ``-tp`` / ``-dp`` / multi-host flags.
"""
