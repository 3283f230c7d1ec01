"""Host-side input preparation of one step: numpy into one pinned buffer, one copy to the device.

Per step the host lays out token ids, positions, slot mapping, logits indices (int64) and
``query_start_loc``, ``seq_lens`` and the block table (int32) back to back in one pinned
byte buffer, and copies the used prefix to a device byte buffer with a single
``non_blocking`` copy; the device tensors are views of that buffer. Per-request work is
one Python iteration (never one per token or per block): block tables are kept per
request in a numpy pool and only newly appended block ids are copied into it, as in
vLLM's persistent ``BlockTable`` (Apache-2.0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from surge.core.outputs import SchedulerOutput
from surge.request import Request
from surge.worker.decode_form import DecodeFormPolicy


class _Row:
    """One request's block-table row in the pool: ``source`` is the ``block_ids`` list
    the row mirrors, ``num`` how many of its ids are copied, ``last_step`` when it was used."""

    __slots__ = ("slot", "source", "num", "last_step")

    def __init__(self, slot: int, source: list[int], step: int) -> None:
        self.slot = slot
        self.source = source
        self.num = 0
        self.last_step = step


class BlockTableRows:
    """Per-request block-table rows, updated incrementally.

    Each request owns a row of a ``[capacity, max_blocks_per_seq]`` int32 pool, keyed by
    ``request_id``. A step copies only the block ids appended since the request's last
    step. A row is rebuilt from scratch when its request's ``block_ids`` is a different
    list object (the KV manager replaces the list when it frees a request) or shrank, so
    a missed preemption notice cannot leave stale ids.

    Args:
        capacity: rows in the pool (at least ``max_num_seqs``); rows of requests absent
            from the current step are evicted when the pool is full.
        max_blocks_per_seq: ``ceil(max_model_len / block_size)``.
    """

    def __init__(self, capacity: int, max_blocks_per_seq: int) -> None:
        self.pool = np.zeros((capacity, max_blocks_per_seq), dtype=np.int32)
        self.max_blocks_per_seq = max_blocks_per_seq
        self._rows: dict[str, _Row] = {}
        self._free = list(range(capacity - 1, -1, -1))
        self._step = 0

    def __len__(self) -> int:
        return len(self._rows)

    def drop(self, request_ids: Iterable[str]) -> None:
        """Forget finished or preempted requests (unknown ids are ignored)."""
        for rid in request_ids:
            row = self._rows.pop(rid, None)
            if row is not None:
                self._free.append(row.slot)

    def slots(self, requests: list[Request]) -> tuple[np.ndarray, np.ndarray]:
        """Bring each request's row up to date.

        Returns:
            ``(slots [B] int64, num_blocks [B] int64)``: each request's pool row and how many
            block ids it has.

        Raises:
            ValueError: a request has more blocks than ``max_blocks_per_seq``.
        """
        self._step += 1
        step = self._step
        rows = self._rows
        pool = self.pool
        limit = self.max_blocks_per_seq
        slots: list[int] = []
        known: list[int] = []
        for req in requests:
            ids = req.block_ids
            n = len(ids)
            row = rows.get(req.request_id)
            if row is None or row.source is not ids or row.num > n:
                row = self._new_row(req.request_id, ids, step)
            if n > row.num:
                if n > limit:
                    raise ValueError(
                        f"request {req.request_id!r} has {n} KV blocks, more than max_model_len allows "
                        f"({limit})"
                    )
                pool[row.slot, row.num : n] = ids[row.num : n]
                row.num = n
            row.last_step = step
            slots.append(row.slot)
            known.append(n)
        return np.array(slots, dtype=np.int64), np.array(known, dtype=np.int64)

    def _new_row(self, request_id: str, ids: list[int], step: int) -> _Row:
        old = self._rows.pop(request_id, None)
        if old is not None:
            self._free.append(old.slot)
        if not self._free:  # evict the rows of requests not seen in this step
            for rid in [rid for rid, r in self._rows.items() if r.last_step < step]:
                self._free.append(self._rows.pop(rid).slot)
        if not self._free:
            raise ValueError("block table pool is full: more live requests than its capacity")
        row = self._rows[request_id] = _Row(self._free.pop(), ids, step)
        return row


@dataclass
class PreparedInputs:
    """The device inputs of one step, views of the preparer's device buffer: valid until
    the next :meth:`InputPreparer.prepare` (which reuses the buffer).

    With ``padded_seqs > num_seqs`` (a decode step padded to a CUDA-graph bucket) the
    padding tokens have id 0, position 0 and slot -1, and the padding sequences have
    ``q_len`` 0 (``query_start_loc`` repeats ``num_tokens``) and ``seq_len`` 0, so
    attention neither reads nor writes the cache for them.

    In decode form (:mod:`surge.worker.decode_form`: a small prefill or mixed step padded to
    a decode-graph bucket) the token rows are laid out as usual, but each token is a
    sequence of its own: ``num_seqs == num_tokens``, ``query_start_loc`` is ``0..T``, the
    ``seq_len`` of token ``j`` at position ``p_j`` is ``p_j + 1``, its block-table row is its
    request's, and ``max_query_len`` is 1. ``logits_indices`` and ``pending_idx`` are token
    rows, the same in both layouts.

    Attributes:
        num_tokens, num_seqs: real tokens and sequences (in decode form, sequences are
            the ``num_tokens`` decode rows).
        padded_tokens, padded_seqs: rows of the token and sequence tensors (>= the real counts).
        token_i64: ``[3, padded_tokens]`` int64 rows: input ids, positions, slot mapping
            (each row contiguous and 16-byte aligned; the row stride may be one longer).
        seq_i32: ``[2, R]`` int32 rows, ``R >= padded_seqs + 1`` (a multiple of 4, so both
            rows are 16-byte aligned): ``query_start_loc`` in the first ``padded_seqs + 1``
            entries of row 0, ``seq_lens`` in the first ``padded_seqs`` of row 1.
        block_table: ``[num_seqs, width]`` int32, zero beyond each sequence's blocks.
        logits_indices: ``[S]`` int64 token rows of the sampled sequences.
        max_query_len, max_seq_len: host ints over the real sequences.
        query_start_loc_cpu, seq_lens_cpu: host copies (padded) for host-looping backends.
        sample_requests: the ``S`` requests sampled this step, in row order.
        all_rows_sample: every sequence samples and each has one token (rows = tokens).
        pending_idx: ``[2, P]`` int64 (asynchronous scheduling): token rows of this step
            whose ids are pending (row 0; their ``input_ids`` hold 0 until filled) and the
            rows of the previous step's sampled ids that hold them (row 1); None when P = 0.
        pending_identity: both rows of ``pending_idx`` are ``0..P-1`` (one contiguous copy).
        min_query_len: the shortest q_len over the real sequences (host int; 1 in a pure
            decode step, where it is not computed).
        decode_form: the step is laid out in decode form (see above).
        independent_rows: a pure decode step whose rows read none of the K/V that another row
            writes in this step (:attr:`surge.layers.attention_backend.AttentionMetadata.independent_rows`):
            one sequence, or several of which none completes a KV block. A block completed
            in this step is already in the prefix cache, and a request admitted in the same
            step may read it (``Scheduler``: full blocks are registered when scheduled); a
            decode token outside a block's last slot writes a block no other request holds.
    """

    num_tokens: int
    num_seqs: int
    padded_tokens: int
    padded_seqs: int
    token_i64: torch.Tensor
    seq_i32: torch.Tensor
    block_table: torch.Tensor
    logits_indices: torch.Tensor
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    sample_requests: list[Request]
    all_rows_sample: bool
    pending_idx: torch.Tensor | None = None
    pending_identity: bool = False
    min_query_len: int = 1
    decode_form: bool = False
    independent_rows: bool = False

    @property
    def num_pending(self) -> int:
        """Tokens whose ids come from the previous step's sampled ids on the device."""
        return 0 if self.pending_idx is None else self.pending_idx.shape[1]

    @property
    def input_ids(self) -> torch.Tensor:
        """``[padded_tokens]`` int64 token ids (row 0 of :attr:`token_i64`)."""
        return self.token_i64[0]

    @property
    def positions(self) -> torch.Tensor:
        """``[padded_tokens]`` int64 positions in their sequences (row 1 of :attr:`token_i64`)."""
        return self.token_i64[1]

    @property
    def slot_mapping(self) -> torch.Tensor:
        """``[padded_tokens]`` int64 KV cache slots, ``block_id * block_size + offset``; -1 for
        padding (row 2 of :attr:`token_i64`)."""
        return self.token_i64[2]

    @property
    def query_start_loc(self) -> torch.Tensor:
        """``[padded_seqs + 1]`` int32 cumulative query lengths (row 0 of :attr:`seq_i32`)."""
        return self.seq_i32[0, : self.padded_seqs + 1]

    @property
    def seq_lens(self) -> torch.Tensor:
        """``[padded_seqs]`` int32 KV lengths once this step's tokens are written (row 1 of
        :attr:`seq_i32`)."""
        return self.seq_i32[1, : self.padded_seqs]


class InputPreparer:
    """Builds :class:`PreparedInputs` from a :class:`SchedulerOutput`.

    Args:
        device: where the model runs; on CUDA the host buffer is pinned and copied with
            one ``non_blocking`` copy per step, on CPU the device views alias it.
        max_num_tokens: most tokens of a step (``max_num_batched_tokens``, or a larger
            padded decode bucket).
        max_num_seqs: most sequences of a step.
        block_size: tokens per KV block.
        max_model_len: longest sequence in tokens (sets the block table's full width).
    """

    def __init__(
        self,
        device: torch.device,
        max_num_tokens: int,
        max_num_seqs: int,
        block_size: int,
        max_model_len: int,
    ) -> None:
        self.device = device
        self.max_num_tokens = max_num_tokens
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        self.max_blocks_per_seq = -(-max_model_len // block_size)
        self.rows = BlockTableRows(2 * max_num_seqs + 8, self.max_blocks_per_seq)
        nbytes = (
            8 * (3 * (max_num_tokens + 1) + 3 * max_num_seqs)  # token rows, logits and pending rows
            + 16
            + 8 * _round_up(max_num_seqs + 1, 4)
            + 4 * max_num_seqs * self.max_blocks_per_seq
        )
        cuda = device.type == "cuda"
        self._host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=cuda)
        self._host_np = self._host.numpy()
        self._dev = torch.zeros(nbytes, dtype=torch.uint8, device=device) if cuda else self._host
        # The host must not refill the pinned buffer before the previous copy out of it ran.
        self._copy_done = torch.cuda.Event() if cuda else None

    def drop(self, request_ids: Iterable[str]) -> None:
        """Forget per-request state of finished or preempted requests."""
        self.rows.drop(request_ids)

    def prepare(
        self,
        scheduler_output: SchedulerOutput,
        pad_decode: Callable[[int], int | None] | None = None,
        pending_rows: dict[str, int] | None = None,
        decode_form: DecodeFormPolicy | None = None,
    ) -> PreparedInputs:
        """Lay out the step's tokens back to back and copy them to the device.

        Request ``i`` contributes tokens ``[num_computed_tokens, num_computed_tokens +
        num_new_tokens)`` of its prompt + output. When every request has one new token
        and ``pad_decode(num_seqs)`` returns a bucket size, tokens and sequences are padded
        to it (see :class:`PreparedInputs`). Otherwise, when ``decode_form`` allows the step
        and ``pad_decode(num_tokens)`` returns a bucket, the step is laid out in decode form
        (one sequence per token) and padded to that bucket. A decode token one past the
        known tokens is pending (asynchronous scheduling): ``pending_rows`` maps its request
        to the row of the previous step's sampled ids that holds it.

        Raises:
            ValueError: the step exceeds ``max_num_batched_tokens`` / ``max_num_seqs``, a
                request's block table is too short for its tokens or longer than
                ``max_model_len`` allows, or a token is neither known nor pending.
        """
        scheduled = scheduler_output.scheduled
        num_seqs = len(scheduled)
        q_list: list[int] = []
        start_list: list[int] = []
        ids: list[int] = []
        requests: list[Request] = []
        sample_idx: list[int] = []
        pend_dst: list[int] = []
        pend_src: list[int] = []
        for i, s in enumerate(scheduled):
            req = s.request
            n = s.num_new_tokens
            start = req.num_computed_tokens
            q_list.append(n)
            start_list.append(start)
            requests.append(req)
            prompt = req.prompt_token_ids
            if n == 1:
                num_prompt = len(prompt)
                if start < num_prompt:
                    ids.append(prompt[start])
                elif start - num_prompt < len(req.output_token_ids):
                    ids.append(req.output_token_ids[start - num_prompt])
                else:
                    row = None if pending_rows is None else pending_rows.get(req.request_id)
                    if row is None or start != req.num_tokens:
                        raise ValueError(
                            f"request {req.request_id!r}: token {start} is neither known nor pending"
                        )
                    pend_dst.append(len(ids))
                    pend_src.append(row)
                    ids.append(0)
            else:
                if start + n > req.num_tokens:
                    raise ValueError(
                        f"request {req.request_id!r}: a chunk of {n} tokens reaches past its known tokens"
                    )
                ids.extend(req.token_ids_slice(start, start + n))
            if s.sample:
                sample_idx.append(i)
        num_tokens = len(ids)
        if num_tokens > self.max_num_tokens or num_seqs > self.max_num_seqs:
            raise ValueError(
                f"step of {num_tokens} tokens / {num_seqs} sequences exceeds max_num_batched_tokens="
                f"{self.max_num_tokens} / max_num_seqs={self.max_num_seqs}"
            )
        q_lens = np.array(q_list, dtype=np.int64)
        seq_lens = np.array(start_list, dtype=np.int64) + q_lens
        bs = self.block_size
        num_blocks = -(-seq_lens // bs)
        width = int(num_blocks.max())
        if width > self.max_blocks_per_seq:
            raise ValueError(f"a sequence of {int(seq_lens.max())} tokens exceeds max_model_len")
        max_query_len = int(q_lens.max())
        padded_seqs = num_seqs
        in_decode_form = False
        if max_query_len == 1 and pad_decode is not None:
            padded_seqs = pad_decode(num_seqs) or num_seqs
        elif pad_decode is not None and decode_form is not None and decode_form.allows(q_lens, seq_lens):
            bucket = pad_decode(num_tokens)
            if bucket is not None:
                in_decode_form = True
                padded_seqs = bucket
        # Rows of the per-sequence tensors: one per token in decode form.
        num_rows = num_tokens if in_decode_form else num_seqs
        padded_tokens = num_tokens + padded_seqs - num_rows
        slots, known = self.rows.slots(requests)
        for i in np.flatnonzero(known < num_blocks):
            req = requests[int(i)]
            held = len(req.block_ids)
            raise ValueError(
                f"request {req.request_id!r} has {held} KV block{'' if held == 1 else 's'}, "
                f"needs {int(num_blocks[i])} for {int(seq_lens[i])} tokens"
            )

        if self._copy_done is not None:
            self._copy_done.synchronize()
        num_sample = len(sample_idx)
        num_pend = len(pend_dst)
        t, s = padded_tokens, padded_seqs
        # Sections start 16-byte aligned (Triton specialises pointer alignment).
        # Token rows start 16-byte aligned (an even row length): Triton compiles a kernel
        # variant per pointer alignment, and an odd token count would otherwise misalign the
        # positions row and compile a new variant in the middle of serving.
        tr = t + (t & 1)
        num_i64 = 3 * tr + num_sample + 2 * num_pend
        off_seq = _round_up(8 * num_i64, 16)
        seq_row = _round_up(s + 1, 4)
        off_bt = off_seq + 8 * seq_row
        used = off_bt + 4 * num_rows * width
        buf = self._host_np
        tok = buf[: 8 * num_i64].view(np.int64)
        tok_rows = tok[: 3 * tr].reshape(3, tr)[:, :t]
        seq = buf[off_seq:off_bt].view(np.int32).reshape(2, seq_row)
        bt = buf[off_bt:used].view(np.int32).reshape(num_rows, width)

        tok_rows[0, :num_tokens] = ids
        cu = np.empty(num_seqs + 1, dtype=np.int64)
        cu[0] = 0
        np.cumsum(q_lens, out=cu[1:])
        if max_query_len == 1:
            positions = seq_lens - 1
        else:
            positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(seq_lens - q_lens - cu[:-1], q_lens)
        tok_rows[1, :num_tokens] = positions
        rows = np.repeat(np.arange(num_seqs), q_lens) if max_query_len > 1 else np.arange(num_seqs)
        if in_decode_form:  # block-table row j is token j's request's row
            np.take(self.rows.pool[:, :width], slots[rows], axis=0, out=bt, mode="clip")
            bt[np.arange(width)[None, :] >= num_blocks[rows][:, None]] = 0
            bt_rows = np.arange(num_tokens)
        else:
            np.take(self.rows.pool[:, :width], slots, axis=0, out=bt, mode="clip")
            bt[np.arange(width)[None, :] >= num_blocks[:, None]] = 0
            bt_rows = rows
        tok_rows[2, :num_tokens] = bt[bt_rows, positions // bs].astype(np.int64) * bs + positions % bs
        if padded_tokens > num_tokens:
            tok_rows[:2, num_tokens:] = 0
            tok_rows[2, num_tokens:] = -1
        if in_decode_form:
            seq[0, : num_tokens + 1] = np.arange(num_tokens + 1)
            seq[1, :num_tokens] = positions + 1
        else:
            seq[0, : num_seqs + 1] = cu
            seq[1, :num_seqs] = seq_lens
        seq[0, num_rows + 1 :] = num_tokens
        seq[1, num_rows:] = 0
        sample_arr = np.array(sample_idx, dtype=np.int64)
        tok[3 * tr : 3 * tr + num_sample] = cu[1:][sample_arr] - 1
        if num_pend:
            tok[3 * tr + num_sample : 3 * tr + num_sample + num_pend] = pend_dst
            tok[3 * tr + num_sample + num_pend :] = pend_src

        dev = self._dev
        if self._copy_done is not None:
            dev[:used].copy_(self._host[:used], non_blocking=True)
            self._copy_done.record()
        tok_dev = dev[: 8 * num_i64].view(torch.int64)
        identity = num_pend > 0 and pend_dst[-1] == num_pend - 1 and pend_src == pend_dst
        return PreparedInputs(
            num_tokens=num_tokens,
            num_seqs=num_rows,
            padded_tokens=padded_tokens,
            padded_seqs=padded_seqs,
            token_i64=tok_dev[: 3 * tr].view(3, tr)[:, :t],
            seq_i32=dev[off_seq:off_bt].view(torch.int32).view(2, seq_row),
            block_table=dev[off_bt:used].view(torch.int32).view(num_rows, width),
            logits_indices=tok_dev[3 * tr : 3 * tr + num_sample],
            max_query_len=1 if in_decode_form else max_query_len,
            max_seq_len=int(seq_lens.max()),
            query_start_loc_cpu=seq[0, : s + 1].tolist(),
            seq_lens_cpu=seq[1, :s].tolist(),
            sample_requests=[requests[i] for i in sample_idx],
            all_rows_sample=max_query_len == 1 and num_sample == num_seqs,
            pending_idx=tok_dev[3 * tr + num_sample :].view(2, num_pend) if num_pend else None,
            pending_identity=identity,
            min_query_len=int(q_lens.min()) if max_query_len > 1 and not in_decode_form else 1,
            decode_form=in_decode_form,
            independent_rows=max_query_len == 1
            and not in_decode_form
            and (num_seqs == 1 or not bool(np.any(seq_lens % bs == 0))),
        )


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple
