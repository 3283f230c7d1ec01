"""One persistent CUDA launch for the FP8 GEMMs of a batch-1 decode step between two attentions.

At one token a decode step is bound by reading the weights, and one launch per GEMM leaves HBM
idle at every kernel boundary: the Triton split-K chain streams Qwen3-8B's 6.95 GB of FP8
weights at about 2.5 TB/s on an H200 (76 us per layer), far from the 4.5 TB/s a plain read
reaches. Here one launch runs a list of *phases*, each an M = 1 GEMV ``y = W x`` (``W``
float8_e4m3fn ``[n, k]`` row-major with one float32 scale per row), separated by grid barriers.
What makes it fast is that weights do not depend on activations: every warp keeps the next
4 KiB of its weight rows in flight in registers across the barrier, so the stream does not stop
while the slowest block finishes (``benchmarks/cuda_stream_probe.py``: 55 us per layer, 27 %
faster than the Triton chain).

One block per multiprocessor (all resident; the grid barrier needs that), ``_WARPS`` warps.
Phase ``p`` gives block ``c`` rows ``[n c / G, n (c + 1) / G)`` (row pairs for a SwiGLU
epilogue), and its warps take them round robin, 4 KiB segments of a row at a time
(``ld.global.nc``, 16 bytes per lane). Each block first builds the phase's input (all ``k``
values, in shared memory as fp16 with a power-of-two scale that keeps ``|x| <= 16``, so eight
fp16 products of an e4m3 weight (``|w| <= 448``) and an input cannot overflow) from the bf16
``x`` according to its kind: as it is (:data:`KIND_INPUT`, :data:`KIND_STATS`) or
``rmsnorm(x) * norm_w`` with Hugging Face's bf16 roundings (:data:`KIND_NORM`,
:data:`KIND_NORM_STATS`). The scale needs the largest value and the norm its sum of squares
before any value is written: the STATS kinds read them from the previous phase (one pair per
block), so their build is one pass over ``x``. Warp 0 alone reads those pairs and shares their
sums after a block barrier: read by every warp of every block, the pairs' few L2 lines took
``16 G`` requests each at once, and the builds took 2.2 us per layer longer (H200, Qwen3-8B:
``stream_decode_bench.py`` 67.98 -> 65.77 us per layer; served C1/I32/O256 335.0 -> 344.8 tok/s,
``benchmarks/results/h200-qwen3-8b-fp8/session30/``).

Each finished row ends in an *epilogue* run by the warp's lane 0: store ``out`` to ``y``
(:data:`EPI_NONE`); or add it to the residual, ``h = bf16(res_in + bf16(out))`` to ``res_out``
(:data:`EPI_ADD`, before a norm); or, when the warp has done both rows of a gate/up pair,
``bf16(bf16(silu(bf16(g))) * bf16(u))`` to ``y`` (:data:`EPI_SILU`, before ``down``). The last
two also sum ``h^2`` and take the largest ``|h * next_norm_w|`` (or ``|a|``) of the block's rows,
stored to ``stats_out[2 c : 2 c + 2]`` for the next phase. So the next phase reads bf16 values
that are already final, once, instead of rebuilding them from float32 outputs in every block
(v3: two passes and two block barriers per phase; 68.6 against the probe's 59.0 us per layer).

Rows are dot products of 16 weights at a time (``cvt.rn.f16x2.e4m3x2``, ``fma.rn.f16x2``), summed
in float32; ``y[row] = acc * w_scale[row] * 2^e`` is stored as float32 or bf16. Block-scaled
weights (FP8 checkpoints with ``weight_block_size [bn, 128]``, as Qwen's FP8 releases) multiply
each 16-product sum by its block's scale instead: a segment's 32 blocks have one scale per lane,
loaded with the segment and taken by a warp shuffle. Results match
:func:`stream_reference` to fp16 rounding (the tests' bound), not bit for bit with the Triton path.

The kernel is compiled at first use with NVRTC through ``torch.cuda._compile_kernel`` (no
headers; sm89+ for the e4m3 conversion). Sources: the PTX ISA (``cvt``, ``fma.rn.f16x2``,
``ld.acquire``, ``bar.sync``); the grid barrier is the usual arrive-counter (release add, acquire
poll) of cooperative groups; the persistent layout follows the "megakernel" idea of Hazy
Research's low-latency Llama decode (2025), written here for Surge's FP8 weights.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from surge.quant.fp8 import quantize_block, quantize_kv, quantize_per_channel

KIND_INPUT = 0
"""Input kind: ``x`` as it is (bf16 ``[k]``, e.g. the attention output)."""
KIND_NORM = 1
"""Input kind: ``rmsnorm(x) * norm_w``; block 0 copies ``x`` to ``copy_out`` if given."""
KIND_NORM_STATS = 2
"""Input kind: as :data:`KIND_NORM`, with the sum of squares and the largest ``|x * norm_w|``
taken from the previous phase's :data:`EPI_ADD` statistics (``stats_in``)."""
KIND_STATS = 3
"""Input kind: ``x`` as it is, with its largest ``|x|`` from the previous phase's
:data:`EPI_SILU` statistics (``stats_in``)."""

EPI_NONE = 0
"""Epilogue: ``y[row] = out``."""
EPI_ADD = 1
"""Epilogue: ``h = bf16(res_in[row] + bf16(out))`` stored to ``res_out[row]`` (and ``out`` to
``y`` if given); statistics for the next phase's :data:`KIND_NORM_STATS`."""
EPI_SILU = 2
"""Epilogue over gate/up row pairs ``(i, n/2 + i)``: ``y[i] = bf16(bf16(silu(bf16(g))) *
bf16(u))``; statistics for the next phase's :data:`KIND_STATS`."""

WEIGHT_BLOCK_K = 128
"""Columns of a block-scaled weight's block (FP8 checkpoints' ``weight_block_size [bn, 128]``):
a 4 KiB segment spans 32 blocks, one scale per lane."""
_WARPS = 16
_SEG = 4096
XMAX = 16384
"""Largest ``k`` a phase may have (fp16 inputs in shared memory)."""
_EPMAX = 2048
STATS_LEN = 2048
"""Float32 values a statistics buffer holds: one (sum of squares, max) pair per block, for up to
1024 multiprocessors."""
_SMEM = 2 * XMAX + 4 * _EPMAX  # dynamic shared memory: fp16 inputs, staged residual/norm pairs (bytes)
_HANG = 1 << 30
HEADS_DONE = 32
"""Where the per-KV-head attention arrival counters start in :attr:`StreamDecodeKernel.counter`
(int32 words; the grid barrier's is word 0, 128 bytes away)."""
MIN_SPLIT_TOKENS = 32
"""Sets how finely an attend phase splits a context: ``L`` tokens go in ``n = clamp(ceil(L /
MIN_SPLIT_TOKENS), 1, splits)`` even shares of ``ceil(L / n)`` tokens, one block per share and KV
head (the blocks past the last share return), so that a short context's merge reads few partials. On the H200 (Qwen3-8B, 16 splits) 32 against
all 16 splits at every length: -1.54, -1.01, -0.78, -0.33 and -0.28 us per layer at 32, 160,
288, 1,024 and 2,048 tokens (64: -1.50, -0.28, -0.51, -0.13, -0.16); served at C1/I32/O256 330.8
against 326.2 tok/s (``benchmarks/results/h200-qwen3-8b-fp8/session27/attention-splits/``)."""

_SOURCE = r"""
#define NW 16
#define SEG 4096
#define XMAX 16384
#define EPMAX 2048
#define THREADS (NW * 32)
#define MAXV (XMAX / (THREADS * 4))
#define STATS_UNROLL 8
#define HANG (1u << 30)
#define MAX_POLLS (1u << 26)
#if !defined(MIN_SPLIT_TOKENS) || !defined(HEADS_DONE) || !defined(KV_FP8) || !defined(BLOCK_SCALED)
#error "MIN_SPLIT_TOKENS, HEADS_DONE, KV_FP8 and BLOCK_SCALED are defined by StreamDecodeKernel.compile"
#endif

typedef unsigned long long u64;
struct __align__(16) U4 { unsigned x, y, z, w; };
struct Phase {
  u64 w, w_scale, x, norm_w, copy_out, stats_in, y, res_in, res_out, next_norm_w, stats_out;
  int n, k, kind, epi, y_bf16;
  float eps;
  // attention phases (op OP_ATTEND; n = 0: no weight rows): x = qkv, y = the output
  u64 k_cache, v_cache, cos, sin, q_norm_w, k_norm_w, part;
  int op, heads, kv_heads, block_size, splits, qk_norm;
  float scale, qk_eps;
  // an FP8 (e4m3) KV cache (kv_fp8 = 1): dequantization multipliers and their inverses
  float k_scale, v_scale, k_inv, v_inv;
  int kv_fp8, pad0;
  // block-scaled weights (FP8 checkpoints' weight_block_size): w_scale is float32
  // [n / wbn, k / WBK], one scale per wbn x WBK block; wbn = 0: one scale per row
  int wbn, wbk;
};
#define WBK 128  // a block scale's columns (WEIGHT_BLOCK_K): SEG / WBK = 32, one scale per lane per segment
#define OP_GEMV 0
#define OP_ATTEND 1
// counter[HEADS_DONE + h]: arrivals of KV head h's attention shares this step (apart from the
// grid barrier's counter[0], another 128-byte line)
#define HD 128
#define GMAX 4
#define TOK 4  // tokens per warp per attend step
static_assert(GMAX * TOK == 16 && TOK == 4, "attend maps lane / 8 to a head and lane / 2 % 4 to a token");
#define PART (HD + 2)
#define MERGE_MAX 16  // partials a merge loads at once (more: one at a time)
// block ids an attend block stages: what shared memory holds after its other buffers
#define IDS ((2 * XMAX + 4 * EPMAX) / 4 - (GMAX + 2) * HD - NW * GMAX * PART)
#define NEG_INF (__int_as_float(0xff800000u))
// Step metadata of the one sequence (device pointers, passed per launch).
struct Meta {
  const int* seq_len;        // shared memory: seq_lens[0] (see the barrier in stream_decode)
  const long long* position;  // shared memory: positions[0]
  const int* seq_lens;
  const int* block_table;
  const long long* slot_mapping;
  const long long* positions;
};
struct Task { int p, j, s; };

__device__ __forceinline__ unsigned cvt_e4m3x2(unsigned short v) {
  unsigned r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
}
__device__ __forceinline__ unsigned hfma2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ unsigned hmul2(unsigned a, unsigned b) {
  unsigned d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ float h2sum(unsigned h) {
  unsigned short lo, hi;
  asm("mov.b32 {%0, %1}, %2;" : "=h"(lo), "=h"(hi) : "r"(h));
  float a, b;
  asm("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"(lo));
  asm("cvt.f32.f16 %0, %1;" : "=f"(b) : "h"(hi));
  return a + b;
}
__device__ __forceinline__ unsigned pack_h2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned short to_bf16(float x) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
__device__ __forceinline__ float bf16r(float x) { return __uint_as_float(((unsigned)to_bf16(x)) << 16); }
__device__ __forceinline__ float bf(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ float lo_bf(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi_bf(unsigned v) { return __uint_as_float(v & 0xffff0000u); }
__device__ __forceinline__ unsigned pack_bf2(float lo, float hi) {
  return (unsigned)to_bf16(lo) | ((unsigned)to_bf16(hi) << 16);
}
// the fp16 in the low half of h, in float32
__device__ __forceinline__ float h2f(unsigned h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h & 0xffffu)));
  return f;
}
// e4m3 -> bf16 is exact (3 mantissa bits, exponents 2^-9 .. 2^8): four cache bytes to the
// four bf16 values a bf16 cache's 8-byte load gives (byte i -> value i)
__device__ __forceinline__ uint2 e4m3x4_to_bf16x4(unsigned v) {
  const unsigned lo = cvt_e4m3x2(v & 0xffffu), hi = cvt_e4m3x2(v >> 16);
  return make_uint2(pack_bf2(h2f(lo), h2f(lo >> 16)),
                    pack_bf2(h2f(hi), h2f(hi >> 16)));
}
// x * inv clamped to the e4m3 range and rounded to nearest even, as torch's .to(float8_e4m3fn)
// after clamp (quantize_kv): the byte, and its value back in float32
__device__ __forceinline__ unsigned char to_e4m3(float x, float inv, float& back) {
  unsigned short b;
  const float q = fminf(fmaxf(x * inv, -448.f), 448.f);
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(b) : "f"(0.f), "f"(q));
  const unsigned h = cvt_e4m3x2(b);
  back = h2f(h);
  return (unsigned char)(b & 0xffu);
}
// L2-only loads for what other blocks wrote in this launch; .nc for what no launch writes.
__device__ __forceinline__ void ld_cg2(const unsigned short* p, unsigned* v) {
  asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "l"(p));
}
__device__ __forceinline__ void ld_nc2(const unsigned short* p, unsigned* v) {
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "l"(p));
}
__device__ __forceinline__ unsigned short ld_cg_u16(const unsigned short* p) {
  unsigned short v;
  asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void block_sync() { asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory"); }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Rows a phase hands out: weight rows, or (SwiGLU epilogue) gate/up row pairs.
__device__ __forceinline__ int rows_total(const Phase& d) { return d.epi == 2 ? d.n >> 1 : d.n; }
__device__ __forceinline__ int ksegs(const Phase& d) { return (d.k + SEG - 1) / SEG; }
// Segments of one task row: the row's, or (pairs) the gate row's then the up row's.
__device__ __forceinline__ int task_segs(const Phase& d) { return d.epi == 2 ? 2 * ksegs(d) : ksegs(d); }
// Block cta's first row of phase d: rows * cta / G in 32 bits (rows * G < 2^32 for any model).
__device__ __forceinline__ int row0_of(const Phase& d, int cta, int G) {
  return (int)((unsigned)rows_total(d) * (unsigned)cta / (unsigned)G);
}
__device__ __forceinline__ int rows_of(const Phase& d, int cta, int G) {
  return row0_of(d, cta + 1, G) - row0_of(d, cta, G);
}
// The first task at or after t whose row exists (phases with fewer rows than warps skip).
__device__ __forceinline__ bool seek(Task& t, const Phase* ph, int np, int cta, int G, int warp) {
  while (t.p < np) {
    if (t.j < rows_of(ph[t.p], cta, G)) return true;
    ++t.p;
    t.j = warp;
    t.s = 0;
  }
  return false;
}
__device__ __forceinline__ bool next_task(Task& t, const Phase* ph, int np, int cta, int G, int warp) {
  if (t.s + 1 < task_segs(ph[t.p])) {
    ++t.s;
    return true;
  }
  t.s = 0;
  t.j += NW;
  return seek(t, ph, np, cta, G, warp);
}
// Issues the loads of task t's 4 KiB weight segment (lane's 8 x 16 bytes) and of its row's scale.
__device__ __forceinline__ void load_seg(U4 (&r)[8], float& scale, const Phase* ph, const Task& t, int cta, int G,
                                         int lane) {
  const Phase& d = ph[t.p];
  const int ks = ksegs(d);
  const int half = t.s >= ks ? 1 : 0;
  const int cs = t.s - half * ks;
  const long long row = row0_of(d, cta, G) + t.j + (half ? (d.n >> 1) : 0);
  if (BLOCK_SCALED) {  // lane j: the scale of the segment's j-th K block (the loop shuffles it)
    // a per-row phase here (d.wbn 0) reads no scale: the phase marks the launch hung
    const int cols = d.k / WBK, kb = cs * (SEG / WBK) + lane;
    scale = kb < cols && d.wbn ? __ldg(reinterpret_cast<const float*>(d.w_scale) + (row / max(d.wbn, 1)) * cols + kb)
                               : 0.f;
  } else {
    scale = __ldg(reinterpret_cast<const float*>(d.w_scale) + row);
  }
  const unsigned char* src = reinterpret_cast<const unsigned char*>(d.w) + row * d.k + (long long)cs * SEG;
  const int bytes = min(SEG, d.k - cs * SEG);
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const int off = (lane + 32 * q) * 16;
    if (off < bytes) {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(r[q].x), "=r"(r[q].y), "=r"(r[q].z), "=r"(r[q].w)
                   : "l"(src + off));
    }
  }
}
__device__ __forceinline__ float dot16(const U4& w, const U4& xa, const U4& xb) {
  unsigned h = hmul2(cvt_e4m3x2(w.x & 0xffff), xa.x);
  h = hfma2(cvt_e4m3x2(w.x >> 16), xa.y, h);
  h = hfma2(cvt_e4m3x2(w.y & 0xffff), xa.z, h);
  h = hfma2(cvt_e4m3x2(w.y >> 16), xa.w, h);
  h = hfma2(cvt_e4m3x2(w.z & 0xffff), xb.x, h);
  h = hfma2(cvt_e4m3x2(w.z >> 16), xb.y, h);
  h = hfma2(cvt_e4m3x2(w.w & 0xffff), xb.z, h);
  h = hfma2(cvt_e4m3x2(w.w >> 16), xb.w, h);
  return h2sum(h);
}

// Builds phase d's input in xs (fp16, scaled by 2^-e, permuted so that 16-byte unit u of a
// segment finds its values at halves [u * 8, u * 8 + 8) and [2048 + u * 8, ...)); returns 2^e.
// One pass: each thread holds its (up to 32) values in registers. The norm's sum of squares and
// the largest |value| come from the previous phase's epilogue (one float pair per block) for
// the STATS kinds, else from a block reduction. Also stages the residual and next-norm values
// of this block's rows for an ADD epilogue (ep: [row] = (res, norm_w) bf16 pairs).
__device__ float build_x(const Phase& d, const unsigned short* xin, unsigned short* xs, unsigned short* ep,
                         float* red, int cta, int G, int tid, int warp, int lane) {
  const int k = d.k;
  const int kind = d.kind;
  const bool norm = kind == 1 || kind == 2;
  const unsigned short* nw = reinterpret_cast<const unsigned short*>(d.norm_w);
  unsigned xr[MAXV][2], wr[MAXV][2];
#pragma unroll
  for (int j = 0; j < MAXV; ++j) {
    const int i = (tid + j * THREADS) * 4;
    xr[j][0] = xr[j][1] = wr[j][0] = wr[j][1] = 0u;
    if (i < k) {
      ld_cg2(xin + i, xr[j]);
      if (norm) ld_nc2(nw + i, wr[j]);
    }
  }
  // the ADD epilogue's residual and norm weight of this block's rows: issued now, stored to
  // shared memory at the end (a store here would wait for the load before the next issue)
  const int ep_r0 = row0_of(d, cta, G), ep_rows = d.epi == 1 ? min(rows_of(d, cta, G), EPMAX) : 0;
  const unsigned short* rin = reinterpret_cast<const unsigned short*>(d.res_in);
  const unsigned short* nnw = reinterpret_cast<const unsigned short*>(d.next_norm_w);
  unsigned short e_res = 0, e_nw = 0;
  if (tid < ep_rows) {
    e_res = ld_cg_u16(rin + ep_r0 + tid);
    e_nw = __ldg(nnw + ep_r0 + tid);
  }
  float ss = 0.f, am = 0.f;
  if (kind >= 2) {
    // warp 0 alone reads the previous phase's G statistics pairs and shares their sums: with every
    // warp of every block reading them, their few L2 lines took 16 x G requests each at once
    if (warp == 0) {
      // all of a lane's loads issued before the first is used (one L2 round trip, not G / 32)
      const float2* st = reinterpret_cast<const float2*>(d.stats_in);
      float2 sv[STATS_UNROLL];
#pragma unroll
      for (int j = 0; j < STATS_UNROLL; ++j) {
        const int c = lane + 32 * j;
        sv[j] = c < G ? __ldcg(st + c) : make_float2(0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < STATS_UNROLL; ++j) {
        ss += sv[j].x;
        am = fmaxf(am, sv[j].y);
      }
      for (int c = lane + 32 * STATS_UNROLL; c < G; c += 32) {
        const float2 v = __ldcg(st + c);
        ss += v.x;
        am = fmaxf(am, v.y);
      }
      ss = warp_sum(ss);
      am = warp_max(am);
      if (lane == 0) {
        red[0] = ss;
        red[NW] = am;
      }
    }
    block_sync();
    ss = red[0];
    am = red[NW];
  } else {
#pragma unroll
    for (int j = 0; j < MAXV; ++j) {
      const float v[4] = {lo_bf(xr[j][0]), hi_bf(xr[j][0]), lo_bf(xr[j][1]), hi_bf(xr[j][1])};
      const float w[4] = {lo_bf(wr[j][0]), hi_bf(wr[j][0]), lo_bf(wr[j][1]), hi_bf(wr[j][1])};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        ss += v[c] * v[c];
        am = fmaxf(am, fabsf(norm ? v[c] * w[c] : v[c]));
      }
    }
    ss = warp_sum(ss);
    am = warp_max(am);
    if (lane == 0) {
      red[warp] = ss;
      red[NW + warp] = am;
    }
    block_sync();
    ss = 0.f;
    am = 0.f;
#pragma unroll
    for (int i = 0; i < NW; ++i) {
      ss += red[i];
      am = fmaxf(am, red[NW + i]);
    }
  }
  const float inv = norm ? rsqrtf(ss / (float)k + d.eps) : 1.f;
  const float bound = am * inv * 1.0001f;
  int e = 0;
  if (bound > 0.f) e = max(-40, min(40, (int)ceilf(log2f(bound * 0.0625f))));
  const float down = exp2f((float)-e);
  unsigned short* cout = reinterpret_cast<unsigned short*>(d.copy_out);
#pragma unroll
  for (int j = 0; j < MAXV; ++j) {
    const int i = (tid + j * THREADS) * 4;
    if (i < k) {
      float x[4] = {lo_bf(xr[j][0]), hi_bf(xr[j][0]), lo_bf(xr[j][1]), hi_bf(xr[j][1])};
      if (norm) {
        const float w[4] = {lo_bf(wr[j][0]), hi_bf(wr[j][0]), lo_bf(wr[j][1]), hi_bf(wr[j][1])};
#pragma unroll
        for (int c = 0; c < 4; ++c) x[c] = bf16r(w[c] * bf16r(x[c] * inv)) * down;
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) x[c] *= down;
      }
      const int s = i / SEG, r = i % SEG, u = r / 16, within = r % 16;
      unsigned* dst = reinterpret_cast<unsigned*>(xs + s * SEG + (within / 8) * 2048 + u * 8 + within % 8);
      dst[0] = pack_h2(x[0], x[1]);
      dst[1] = pack_h2(x[2], x[3]);
      if (kind == 1 && cout != nullptr && cta == 0) {
        asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(cout + i), "r"(xr[j][0]), "r"(xr[j][1]) : "memory");
      }
    }
  }
  if (tid < ep_rows) {
    ep[2 * tid] = e_res;
    ep[2 * tid + 1] = e_nw;
  }
  for (int j = tid + THREADS; j < ep_rows; j += THREADS) {
    ep[2 * j] = ld_cg_u16(rin + ep_r0 + j);
    ep[2 * j + 1] = __ldg(nnw + ep_r0 + j);
  }
  return exp2f((float)e);
}

// One step of a warp's reduce-scatter: of its first 2 W values, a lane keeps the half its bit
// 2 W selects and adds the partner's (lane ^ 2 W) copy of that half.
template <int W>
__device__ __forceinline__ void halve(float* v, int lane) {
  const bool up = (lane & (2 * W)) != 0;
#pragma unroll
  for (int j = 0; j < W; ++j) {
    const float send = up ? v[j] : v[j + W];
    const float keep = up ? v[j + W] : v[j];
    v[j] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * W);
  }
}

// Attention of the one sequence over its paged K/V, one (KV head, split) per block: the split's
// share of the context (the new token's K/V taken from registers: the block that owns it also
// writes them to the cache). Qwen3's per-head q/k RMSNorm (qk_norm) and rotary (GPT-NeoX
// halves, bf16 roundings as torch's) first. Writes the split's unnormalized output, running max
// and sum (base-2 exponent of score * scale * log2 e) per query head into part[head][split]; the
// last split of the KV head to finish merges them into y (a context of one split writes y at once).
// Tokens per split of a context of L tokens over at most S splits: one split per
// MIN_SPLIT_TOKENS tokens (1 to S), so a short context's merge reads few partials. Splits
// 0 .. ceil(L / C) - 1 hold tokens (split 0 also for L = 0); the others write no partial.
__device__ __forceinline__ int split_len(int S, int L) {
  const int used = max(1, min(S, (L + MIN_SPLIT_TOKENS - 1) / MIN_SPLIT_TOKENS));
  return max(1, (L + used - 1) / used);
}
template <bool FP8>  // the cache: e4m3 (d.kv_fp8) or bf16
__device__ void attend(const Phase& d, const Meta& mt, float* sm, unsigned* heads_done, int cta, int tid, int warp,
                       int lane) {
  const int S = d.splits, H = d.kv_heads, G = d.heads / H;
  if (cta >= H * S) return;
  const int h = cta / S, s = cta % S;
  const int L = *mt.seq_len;
  const int C = split_len(S, L);
  if (s * C >= L && s > 0) return;  // no tokens of the context: no partial (the merge reads none)
  const long long pos = *mt.position;
  const int t0 = s * C, t1 = min(L, t0 + C);
  const bool owner = t0 <= L - 1 && L - 1 < t1;
  float* qs = sm;              // [GMAX][HD], times scale * log2 e
  float* kn = sm + GMAX * HD;  // [HD] the new token's k
  float* vn = kn + HD;         // [HD] and v
  float* wacc = vn + HD;       // [NW][GMAX][PART] per-warp results
  int* ids = reinterpret_cast<int*>(wacc + NW * GMAX * PART);  // [IDS] the split's block ids
  const unsigned short* qkv = reinterpret_cast<const unsigned short*>(d.x);
  const int bs = d.block_size;
  const int id0 = t0 / bs, n_ids = t1 > t0 ? (t1 - 1) / bs - id0 + 1 : 0;
  const bool staged = n_ids <= IDS;  // else each token reads the block table itself
  if (staged)
    for (int i = tid; i < n_ids; i += THREADS) ids[i] = mt.block_table[id0 + i];
  if (warp < G + 2) {
    const bool isq = warp < G, isk = warp == G;
    const int off = isq ? (h * G + warp) * HD : (d.heads + (isk ? 0 : H) + h) * HD;
    float x[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) x[c] = bf(qkv[off + lane + 32 * c]);
    if (warp <= G) {
      if (d.qk_norm) {
        float ss = x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
        ss = warp_sum(ss);
        const float inv = rsqrtf(ss / (float)HD + d.qk_eps);
        const unsigned short* nw = reinterpret_cast<const unsigned short*>(isq ? d.q_norm_w : d.k_norm_w);
#pragma unroll
        for (int c = 0; c < 4; ++c) x[c] = bf16r(bf(nw[lane + 32 * c]) * bf16r(x[c] * inv));
      }
      const float* cs = reinterpret_cast<const float*>(d.cos) + pos * (HD / 2);
      const float* sn = reinterpret_cast<const float*>(d.sin) + pos * (HD / 2);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int i = lane + 32 * c;
        const float co = bf16r(cs[i]), si = bf16r(sn[i]);
        const float a = x[c], b = x[c + 2];
        x[c] = bf16r(bf16r(a * co) - bf16r(b * si));
        x[c + 2] = bf16r(bf16r(b * co) + bf16r(a * si));
      }
    }
    // an FP8 cache's K scale goes into q's (scores of the stored K), its V scale onto the output
    const float qscale = d.scale * 1.4426950408889634f * (FP8 ? d.k_scale : 1.f);
    float* dst = isq ? qs + warp * HD : (isk ? kn : vn);
    const long long slot = mt.slot_mapping[0];
    const bool write = !isq && owner && slot >= 0;  // slot -1: a padding token writes nothing
    const long long base = slot * (long long)(H * HD) + h * HD;
    if (FP8 && !isq) {  // the new K/V as stored: e4m3 bytes, and their values for the attention
      unsigned char* cache = reinterpret_cast<unsigned char*>(isk ? d.k_cache : d.v_cache);
      const float inv = isk ? d.k_inv : d.v_inv;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float back;
        const unsigned char b = to_e4m3(x[c], inv, back);
        if (write) cache[base + lane + 32 * c] = b;
        dst[lane + 32 * c] = back;
      }
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) dst[lane + 32 * c] = isq ? x[c] * qscale : x[c];
      if (write) {
        unsigned short* cache = reinterpret_cast<unsigned short*>(isk ? d.k_cache : d.v_cache);
#pragma unroll
        for (int c = 0; c < 4; ++c) cache[base + lane + 32 * c] = to_bf16(x[c]);
      }
    }
  }
  block_sync();
  float qr[GMAX][4], acc[GMAX][4];
  // the running max and sum of query head g_own = lane / 8, kept by that head's 8 lanes;
  // acc by every lane (its 4 dims of each head)
  float m_own = NEG_INF, l_own = 0.f;
  const int g_own = lane >> 3, u_own = (lane >> 1) & 3;
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      qr[g][c] = g < G ? qs[g * HD + 4 * lane + c] : 0.f;
      acc[g][c] = 0.f;
    }
  }
  const unsigned char* kc = reinterpret_cast<const unsigned char*>(d.k_cache);
  const unsigned char* vc = reinterpret_cast<const unsigned char*>(d.v_cache);
  constexpr int esz = FP8 ? 1 : 2;  // bytes per cached value
  // TOK tokens per warp at a time: their K/V loads in flight together, then one online-softmax
  // update per query head over all of them
  for (int tb = t0 + warp; tb < t1; tb += TOK * NW) {
    uint2 kr[TOK], vr[TOK];
#pragma unroll
    for (int u = 0; u < TOK; ++u) {
      const int t = tb + u * NW;
      kr[u] = vr[u] = make_uint2(0u, 0u);
      if (t < t1 && t != L - 1) {
        const int blk = staged ? ids[t / bs - id0] : mt.block_table[t / bs];
        const long long slot = (long long)blk * bs + t % bs;
        const long long idx = slot * (long long)(H * HD) + h * HD + 4 * lane;
        if (FP8) {
          kr[u] = e4m3x4_to_bf16x4(__ldcg(reinterpret_cast<const unsigned*>(kc + idx)));
          vr[u] = e4m3x4_to_bf16x4(__ldcg(reinterpret_cast<const unsigned*>(vc + idx)));
        } else {
          kr[u] = __ldcg(reinterpret_cast<const uint2*>(kc + 2 * idx));
          vr[u] = __ldcg(reinterpret_cast<const uint2*>(vc + 2 * idx));
        }
      }
    }
    // the next step's K/V lines into L2 while this one computes: lane 4 u + (K low, K high, V low, V high)
    if (lane < 4 * TOK) {
      const int t = tb + TOK * NW + (lane >> 2) * NW;
      if (t < t1) {
        const int blk = staged ? ids[t / bs - id0] : mt.block_table[t / bs];
        const long long slot = (long long)blk * bs + t % bs;
        const unsigned char* line =
            ((lane & 2) ? vc : kc) + (slot * (long long)(H * HD) + h * HD + (lane & 1) * 64) * esz;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
      }
    }
    if (L - 1 >= tb && L - 1 < tb + TOK * NW && (L - 1 - tb) % NW == 0) {  // the new token, from shared
      const int u = (L - 1 - tb) / NW;
      const float* k4 = kn + 4 * lane;
      const float* v4 = vn + 4 * lane;
#pragma unroll
      for (int w = 0; w < TOK; ++w) {
        if (w == u) {
          kr[w] = make_uint2(pack_bf2(k4[0], k4[1]), pack_bf2(k4[2], k4[3]));
          vr[w] = make_uint2(pack_bf2(v4[0], v4[1]), pack_bf2(v4[2], v4[3]));
        }
      }
    }
    // partial dot products (this lane's 4 dims) of every (head g, token u), reduced across the
    // warp by halving exchanges: 16 sums in 16 shuffles, lane ending with pair j = lane / 2
    float v[GMAX * TOK];
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
#pragma unroll
      for (int u = 0; u < TOK; ++u) {
        v[g * TOK + u] = qr[g][0] * lo_bf(kr[u].x) + qr[g][1] * hi_bf(kr[u].x) + qr[g][2] * lo_bf(kr[u].y) +
                         qr[g][3] * hi_bf(kr[u].y);
      }
    }
    halve<8>(v, lane);
    halve<4>(v, lane);
    halve<2>(v, lane);
    halve<1>(v, lane);
    float s = v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1);
    if (tb + u_own * NW >= t1 || g_own >= G) s = NEG_INF;
    float mx = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, 2));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    const float mn = fmaxf(m_own, mx);
    const bool live = mn != NEG_INF;  // false only on the lanes of a head g >= G
    const float p = live ? exp2f(s - mn) : 0.f;
    const float corr = live ? exp2f(m_own - mn) : 1.f;
    float ps = p + __shfl_xor_sync(0xffffffffu, p, 2);
    ps += __shfl_xor_sync(0xffffffffu, ps, 4);
    l_own = l_own * corr + ps;
    m_own = mn;
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      if (g < G) {
        const float cg = __shfl_sync(0xffffffffu, corr, g * 8);
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[g][c] *= cg;
#pragma unroll
        for (int u = 0; u < TOK; ++u) {
          const float pu = __shfl_sync(0xffffffffu, p, g * 8 + u * 2);
          acc[g][0] += pu * lo_bf(vr[u].x);
          acc[g][1] += pu * hi_bf(vr[u].x);
          acc[g][2] += pu * lo_bf(vr[u].y);
          acc[g][3] += pu * hi_bf(vr[u].y);
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    if (g < G) {
      float* w = wacc + (warp * GMAX + g) * PART;
#pragma unroll
      for (int c = 0; c < 4; ++c) w[4 * lane + c] = acc[g][c];
      const float mg = __shfl_sync(0xffffffffu, m_own, g * 8), lg = __shfl_sync(0xffffffffu, l_own, g * 8);
      if (lane == 0) {
        w[HD] = mg;
        w[HD + 1] = lg;
      }
    }
  }
  block_sync();
  // the block's partial per query head: thread (g, dim) of g < G
  const int g = tid / HD, dim = tid % HD;
  float M = NEG_INF, o = 0.f, ls = 0.f;
  if (g < G) {
    for (int w = 0; w < NW; ++w) M = fmaxf(M, wacc[(w * GMAX + g) * PART + HD]);
    if (M != NEG_INF) {
      for (int w = 0; w < NW; ++w) {
        const float* r = wacc + (w * GMAX + g) * PART;
        const float f = exp2f(r[HD] - M);  // 0 for a warp without tokens (max -inf)
        o += r[dim] * f;
        ls += r[HD + 1] * f;
      }
    }
    if (FP8) o *= d.v_scale;
  }
  unsigned short* y = reinterpret_cast<unsigned short*>(d.y);
  const int used = max(1, (L + C - 1) / C);  // shares holding tokens (the blocks that got here)
  if (used == 1) {  // the only share: its output is the attention's
    if (g < G) y[(h * G + g) * HD + dim] = to_bf16(o / ls);
    return;
  }
  float* part = reinterpret_cast<float*>(d.part);
  if (g < G) {
    float* out = part + ((long long)(h * G + g) * S + s) * PART;
    out[dim] = o;
    if (dim == 0) {
      out[HD] = M;
      out[HD + 1] = ls;
    }
  }
  // the last of KV head h's shares to arrive merges them and zeroes the head's count for the next
  // layer (its arrival at the grid barrier publishes that): one grid barrier fewer than a merge phase
  __shared__ int last;
  block_sync();
  if (tid == 0) {
    __threadfence();
    const unsigned before = atomicAdd(heads_done + h, 1u);
    last = before + 1u == (unsigned)used;
    if (last) __stcg(heads_done + h, 0u);  // nothing else touches it before the next layer
    __threadfence();
  }
  block_sync();
  if (!last || g >= G) return;
  const float* p = part + (long long)(h * G + g) * S * PART;
  M = NEG_INF;
  o = 0.f;
  ls = 0.f;
  if (used <= MERGE_MAX) {  // every partial's loads in flight at once
    float pm[MERGE_MAX], po[MERGE_MAX], pl[MERGE_MAX];
#pragma unroll
    for (int i = 0; i < MERGE_MAX; ++i) {
      pm[i] = i < used ? __ldcg(p + i * PART + HD) : NEG_INF;
      po[i] = i < used ? __ldcg(p + i * PART + dim) : 0.f;
      pl[i] = i < used ? __ldcg(p + i * PART + HD + 1) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < MERGE_MAX; ++i) M = fmaxf(M, pm[i]);
#pragma unroll
    for (int i = 0; i < MERGE_MAX; ++i) {
      const float f = pm[i] == NEG_INF ? 0.f : exp2f(pm[i] - M);
      o += po[i] * f;
      ls += pl[i] * f;
    }
  } else {
    for (int i = 0; i < used; ++i) M = fmaxf(M, __ldcg(p + i * PART + HD));
    for (int i = 0; i < used; ++i) {
      const float ms = __ldcg(p + i * PART + HD);
      const float f = ms == NEG_INF ? 0.f : exp2f(ms - M);
      o += __ldcg(p + i * PART + dim) * f;
      ls += __ldcg(p + i * PART + HD + 1) * f;
    }
  }
  y[(h * G + g) * HD + dim] = to_bf16(o / ls);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
stream_decode(const Phase* __restrict__ phases, int num_phases, unsigned* counter, int phase_base,
              const unsigned short* x0, int use_x0, u64* trace, const int* seq_lens,
              const int* block_table, const long long* slot_mapping, const long long* positions) {
#ifdef TRACE
  // Diagnostic build: thread 0 of each block stamps the global timer (ns) at four points of each
  // phase into trace[phase_base + p][block][0..3]: released by the barrier, input built, rows
  // done, arrived.
#define STAMP(i)                                                                       \
  if (tid == 0) {                                                                      \
    u64 t;                                                                             \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                              \
    trace[((u64)(phase_base + p) * (u64)G + (u64)cta) * 4 + (i)] = t;                  \
  }
#else
#define STAMP(i)
#endif
  extern __shared__ __align__(16) unsigned char dyn[];
  unsigned short* xs = reinterpret_cast<unsigned short*>(dyn);       // [XMAX] fp16, permuted
  unsigned short* ep = reinterpret_cast<unsigned short*>(dyn + 2 * XMAX);  // [EPMAX][2] bf16
  __shared__ float red[2 * NW];
  __shared__ float red_e[2 * NW];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int G = gridDim.x, cta = blockIdx.x;
  Task nt{0, warp, 0};
  bool have = seek(nt, phases, num_phases, cta, G, warp);
  U4 nb[8];
  float nsc = 0.f;
  if (have) load_seg(nb, nsc, phases, nt, cta, G, lane);
#if __CUDA_ARCH__ >= 900
  // Launched with programmatic dependent launch, the grid starts while its predecessor (the
  // attention) finishes: the first weights are in flight; wait for its writes before any other
  // load or store.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  // the context length and position for attention phases: thread 0 loads them before it polls
  // the barrier (their latency hides under the wait), stores them after, and the block sync
  // publishes them (launch inputs: no phase writes them)
  __shared__ int seq_len;
  __shared__ long long position;
  const Meta mt{&seq_len, &position, seq_lens, block_table, slot_mapping, positions};
  for (int p = 0; p < num_phases; ++p) {
    const Phase& d = phases[p];
    if (p > 0) {
      if (tid == 0) {
        const int len = d.op == OP_ATTEND ? __ldg(seq_lens) : 0;  // in flight while it polls
        const long long at = d.op == OP_ATTEND ? __ldg(positions) : 0;
        const unsigned target = (unsigned)G * (unsigned)(phase_base + p);
        unsigned polls = 0;
        for (;;) {
          const unsigned v = ld_acquire(counter);
          if ((v & HANG) || (v & ~HANG) >= target) break;
          if (++polls == MAX_POLLS) {
            atomicOr(counter, HANG);
            break;
          }
        }
        if (d.op == OP_ATTEND) {
          seq_len = len;
          position = at;
        }
      }
      block_sync();
    } else if (d.op == OP_ATTEND) {
      if (tid == 0) {
        seq_len = __ldg(seq_lens);
        position = __ldg(positions);
      }
      block_sync();
    }
    STAMP(0)
    if (d.op == OP_ATTEND) {
      // one cache dtype per build (both in one kernel spill registers): a table of the other
      // marks the launch hung (StreamDecodeKernel.hung) and computes nothing
      if (d.kv_fp8 == KV_FP8)
        attend<KV_FP8 != 0>(d, mt, reinterpret_cast<float*>(dyn), counter + HEADS_DONE, cta, tid, warp, lane);
      else if (tid == 0)
        atomicOr(counter, HANG);
      block_sync();
      STAMP(1)
      STAMP(2)
      if (tid == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
      }
      STAMP(3)
      continue;
    }
    // one scale layout per build (BLOCK_SCALED): a runtime branch between them made the per-row
    // layers 13 % slower on an H200; a phase of the other layout marks the launch hung. Checked
    // before the build: after it, the per-row bf16-KV build spilled 4 bytes at its 128 registers
    // (NVRTC 13.0, sm_90; benchmarks/stream_decode_spills.py), the kernel before session 53 none.
    // The spill cost nothing measurable (H100: 84.0 us per layer with and without it).
    if ((d.wbn != 0) != (BLOCK_SCALED != 0) && tid == 0) atomicOr(counter, HANG);
    const unsigned short* xin =
        reinterpret_cast<const unsigned short*>((p == 0 && use_x0) ? (const void*)x0 : (const void*)d.x);
    const float up = build_x(d, xin, xs, ep, red, cta, G, tid, warp, lane);
    block_sync();
    STAMP(1)
    const int r0 = row0_of(d, cta, G);
    const int k = d.k, ks = ksegs(d), epi = d.epi;
    const bool y_bf16 = d.y_bf16 != 0, blocked = BLOCK_SCALED != 0;
    void* const yp = reinterpret_cast<void*>(d.y);
    float acc = 0.f, g = 0.f, ess = 0.f, eam = 0.f;
    while (have && nt.p == p) {
      U4 cb[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) cb[q] = nb[q];
      const Task ct = nt;
      const float csc = nsc;
      have = next_task(nt, phases, num_phases, cta, G, warp);
      if (have) load_seg(nb, nsc, phases, nt, cta, G, lane);
      const int half = ct.s >= ks ? 1 : 0;
      const int cs = ct.s - half * ks;
      const U4* xv = reinterpret_cast<const U4*>(xs + cs * SEG);
      const int bytes = min(SEG, k - cs * SEG);
      if (blocked) {  // 16-byte unit u = lane + 32 q lies in the segment's K block u / 8 = lane / 8 + 4 q
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const int u = lane + 32 * q;
          const float bsc = __shfl_sync(0xffffffffu, csc, (lane >> 3) + 4 * q);
          if (u * 16 < bytes) acc += dot16(cb[q], xv[u], xv[256 + u]) * bsc;
        }
      } else {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const int u = lane + 32 * q;
          if (u * 16 < bytes) acc += dot16(cb[q], xv[u], xv[256 + u]);
        }
      }
      if (cs + 1 == ks) {
        const float out = warp_sum(acc) * (blocked ? 1.f : csc) * up;
        acc = 0.f;
        const int row = r0 + ct.j;
        if (epi == 2 && !half) {
          g = out;
        } else if (lane == 0) {
          if (epi == 1) {
            const bool staged = ct.j < EPMAX;
            const float rv = bf(staged ? ep[2 * ct.j] : ld_cg_u16(reinterpret_cast<const unsigned short*>(d.res_in) + row));
            const float wv = bf(staged ? ep[2 * ct.j + 1] : __ldg(reinterpret_cast<const unsigned short*>(d.next_norm_w) + row));
            const float h = bf16r(rv + bf16r(out));
            reinterpret_cast<unsigned short*>(d.res_out)[row] = to_bf16(h);
            ess += h * h;
            eam = fmaxf(eam, fabsf(h * wv));
          }
          if (epi == 2) {
            const float gb = bf16r(g);
            const float a = bf16r(bf16r(gb / (1.f + __expf(-gb))) * bf16r(out));
            reinterpret_cast<unsigned short*>(yp)[row] = to_bf16(a);
            eam = fmaxf(eam, fabsf(a));
          } else if (yp != nullptr) {
            if (y_bf16)
              reinterpret_cast<unsigned short*>(yp)[row] = to_bf16(out);
            else
              reinterpret_cast<float*>(yp)[row] = out;
          }
        }
      }
    }
    if (lane == 0) {
      red_e[warp] = ess;
      red_e[NW + warp] = eam;
    }
    block_sync();
    STAMP(2)
    if (tid == 0) {
      if (epi != 0) {
        float s = 0.f, a = 0.f;
#pragma unroll
        for (int i = 0; i < NW; ++i) {
          s += red_e[i];
          a = fmaxf(a, red_e[NW + i]);
        }
        __stcg(reinterpret_cast<float2*>(d.stats_out) + cta, make_float2(s, a));
      }
      __threadfence();
      atomicAdd(counter, 1u);
    }
    STAMP(3)
  }
}
"""


@dataclass(frozen=True)
class StreamPhase:
    """One GEMV of a :func:`stream_decode` launch (tensors on the launch's device): build the
    input from ``x`` by ``kind``, compute ``out = W x``, finish by ``epilogue``.

    Attributes:
        weight: float8_e4m3fn ``[n, k]`` contiguous; ``k`` a multiple of 16, at most
            :data:`XMAX`; ``n`` even for :data:`EPI_SILU` (gate rows, then up rows).
        weight_scale: float32 ``[n]``, one scale per row; or block scales, float32 ``[n / bn,
            k / WEIGHT_BLOCK_K]`` contiguous, one per ``bn x WEIGHT_BLOCK_K`` block of the weight
            (an FP8 checkpoint's ``weight_scale_inv`` with ``weight_block_size [bn, 128]``; ``bn``
            divides ``n``, and ``n / 2`` for :data:`EPI_SILU`).
        kind: :data:`KIND_INPUT`, :data:`KIND_NORM`, :data:`KIND_NORM_STATS` or
            :data:`KIND_STATS`.
        y: the output: float32 or bf16 ``[n]`` (:data:`EPI_NONE`; optional for :data:`EPI_ADD`),
            bf16 ``[n / 2]`` (:data:`EPI_SILU`).
        x: the input, bf16 ``[k]``.
        norm_w: bf16 ``[k]`` RMSNorm weight (the norm kinds).
        eps: RMSNorm epsilon.
        copy_out: bf16 ``[k]``, where :data:`KIND_NORM` copies ``x`` (optional).
        stats_in: float32 ``[STATS_LEN]``, the previous phase's ``stats_out`` (the STATS kinds).
        epilogue: :data:`EPI_NONE`, :data:`EPI_ADD` or :data:`EPI_SILU`.
        res_in, res_out: bf16 ``[n]``, the residual before and after the add (:data:`EPI_ADD`).
        next_norm_w: bf16 ``[n]``, the next phase's ``norm_w`` (:data:`EPI_ADD`).
        stats_out: float32 ``[STATS_LEN]`` (:data:`EPI_ADD`, :data:`EPI_SILU`); the next phase
            reads it, so consecutive phases must not share one.
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor
    kind: int
    y: torch.Tensor | None
    x: torch.Tensor
    norm_w: torch.Tensor | None = None
    eps: float = 1e-6
    copy_out: torch.Tensor | None = None
    stats_in: torch.Tensor | None = None
    epilogue: int = EPI_NONE
    res_in: torch.Tensor | None = None
    res_out: torch.Tensor | None = None
    next_norm_w: torch.Tensor | None = None
    stats_out: torch.Tensor | None = None

    @property
    def n(self) -> int:
        """Weight rows."""
        return int(self.weight.shape[0])

    @property
    def k(self) -> int:
        """Input length."""
        return int(self.weight.shape[1])

    @property
    def block_n(self) -> int:
        """Rows per block of a block-scaled weight (``n / weight_scale.shape[0]``); 0 for one
        scale per row."""
        if self.weight_scale.dim() != 2:
            return 0
        return self.n // max(1, int(self.weight_scale.shape[0]))


def check_phase(ph: StreamPhase) -> None:
    """Raises ``ValueError`` unless ``ph`` has the shapes, dtypes and tensors its kind and
    epilogue need."""
    n, k, bf, f32 = ph.n, ph.k, torch.bfloat16, torch.float32
    if ph.weight.dtype != torch.float8_e4m3fn or not ph.weight.is_contiguous():
        raise ValueError("stream phase weight must be contiguous float8_e4m3fn [n, k]")
    if k % 16 or k > XMAX:
        raise ValueError(f"stream phase k={k} must be a multiple of 16 and at most {XMAX}")
    sc = ph.weight_scale
    if sc.dim() == 2:
        rows, cols = int(sc.shape[0]), int(sc.shape[1])
        half = n // 2 if ph.epilogue == EPI_SILU else n
        if (
            sc.dtype != f32
            or not sc.is_contiguous()
            or rows < 1
            or n % rows
            or half % (n // rows)
            or k % WEIGHT_BLOCK_K
            or cols != k // WEIGHT_BLOCK_K
        ):
            raise ValueError(
                f"stream phase block scales must be contiguous float32 [n / bn, k / {WEIGHT_BLOCK_K}] with bn "
                f"dividing n (and n / 2 for a SwiGLU epilogue), got {list(sc.shape)} {sc.dtype} for weight [{n}, {k}]"
            )
    elif sc.dtype != f32 or sc.numel() != n:
        raise ValueError("stream phase weight_scale must be float32 [n]")
    kinds: dict[int, tuple[str, ...]] = {
        KIND_INPUT: (),
        KIND_NORM: ("norm_w",),
        KIND_NORM_STATS: ("norm_w", "stats_in"),
        KIND_STATS: ("stats_in",),
    }
    epilogues: dict[int, tuple[str, ...]] = {
        EPI_NONE: ("y",),
        EPI_ADD: ("res_in", "res_out", "next_norm_w", "stats_out"),
        EPI_SILU: ("y", "stats_out"),
    }
    if ph.kind not in kinds:
        raise ValueError(f"unknown stream phase kind {ph.kind}")
    if ph.epilogue not in epilogues:
        raise ValueError(f"unknown stream phase epilogue {ph.epilogue}")
    for name in ("x", *kinds[ph.kind], *epilogues[ph.epilogue]):
        if getattr(ph, name) is None:
            raise ValueError(f"stream phase of kind {ph.kind}, epilogue {ph.epilogue} needs {name}")
    if ph.epilogue == EPI_SILU and n % 2:
        raise ValueError(f"a SwiGLU epilogue needs gate and up rows: n={n} is odd")
    if ph.y is not None:
        y_len = n // 2 if ph.epilogue == EPI_SILU else n
        dtypes = (bf,) if ph.epilogue == EPI_SILU else (f32, bf)
        if ph.y.numel() != y_len or ph.y.dtype not in dtypes:
            raise ValueError(f"stream phase y must be {' or '.join(map(str, dtypes))} [{y_len}]")
    # (dtype, least numel) of what the phase reads and writes besides weight and y
    operands = {
        "x": (bf, k),
        "norm_w": (bf, k),
        "copy_out": (bf, k),
        "stats_in": (f32, STATS_LEN),
        "res_in": (bf, n),
        "res_out": (bf, n),
        "next_norm_w": (bf, n),
        "stats_out": (f32, STATS_LEN),
    }
    for name, (dtype, numel) in operands.items():
        t = getattr(ph, name)
        if t is None:
            continue
        if t.dtype != dtype or t.numel() < numel or not t.is_contiguous() or t.device != ph.weight.device:
            raise ValueError(
                f"stream phase: {name} must be a contiguous {dtype} tensor of at least {numel} values "
                f"on {ph.weight.device}"
            )


OP_ATTEND = 1
"""The ``op`` of an attention phase's row in the launch table (a GEMV's is 0)."""
HEAD_DIM = 128
"""The head size attention phases support."""
GROUP_MAX = 4
"""The most query heads per KV head attention phases support."""


@dataclass(frozen=True)
class StreamAttention:
    """A decode attention step of the one sequence inside a launch, one phase: per-head q/k
    RMSNorm if ``q_norm_w`` is given, rotary, the new K/V written to the caches at the step's
    slot, then each (KV head, split) block's share of the context; a context of one share
    writes ``y`` at once, else each share writes its partial to ``part`` and the last share of
    each KV head to finish (arrival counters after the grid barrier's, zeroed by
    :meth:`StreamDecodeKernel.reset` and by each head's last share) merges them into ``y``, the
    classic "last block" reduction of the CUDA samples' ``threadFenceReduction``. Every share
    of the phase must have a block (``kv_heads * splits`` at most the launch's blocks). The step's sequence length, block
    table, slot and position come from the launch's :class:`StreamMeta`.

    Attributes:
        qkv: bf16 ``[(heads + 2 kv_heads) * 128]``, the qkv projection's output.
        y: bf16 ``[heads * 128]``, the attention output.
        k_cache, v_cache: bf16 or float8_e4m3fn ``[num_blocks, block_size, kv_heads, 128]``,
            contiguous, both of one dtype. An FP8 cache stores ``clamp(x / scale, ±448)`` in e4m3
            (as :func:`surge.quant.fp8.quantize_kv`) and is read as ``value * scale``.
        cos, sin: float32 ``[max_position, 64]`` rotary tables.
        q_norm_w, k_norm_w: bf16 ``[128]`` per-head RMSNorm weights, or None (no q/k norm).
        part: float32 ``[heads * splits * 130]`` scratch: per head and split the unnormalized
            output, the running max and the sum.
        heads, kv_heads: query and KV heads (``heads / kv_heads`` at most :data:`GROUP_MAX`).
        splits: context splits per KV head (``kv_heads * splits`` at most the blocks of a launch);
            a context of ``L`` tokens is cut into ``n = clamp(ceil(L / MIN_SPLIT_TOKENS), 1,
            splits)`` even shares of ``ceil(L / n)`` tokens; the blocks past the last share
            return at once and the merge reads only the partials written.
        scale: the softmax scale. qk_eps: the q/k norm's epsilon.
        k_scale, v_scale: an FP8 cache's dequantization multipliers (positive; ignored for bf16).
    """

    qkv: torch.Tensor
    y: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    q_norm_w: torch.Tensor | None
    k_norm_w: torch.Tensor | None
    part: torch.Tensor
    heads: int
    kv_heads: int
    splits: int
    scale: float
    qk_eps: float = 1e-6
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def kv_fp8(self) -> bool:
        """Whether the caches are FP8 (e4m3)."""
        return self.k_cache.dtype == torch.float8_e4m3fn


@dataclass(frozen=True)
class StreamMeta:
    """The step's layout that attention phases read (device tensors, batch 1): ``seq_lens``
    int32 ``[>= 1]`` (context after this token), ``block_table`` int32 ``[>= 1, width]`` (row 0
    read), ``slot_mapping`` int64 ``[>= 1]`` (the new token's cache slot), ``positions`` int64
    ``[>= 1]``."""

    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor


def check_attention(ph: StreamAttention) -> None:
    """Raises ``ValueError`` unless ``ph`` has the shapes and dtypes the kernel needs."""
    bf, f32, hd = torch.bfloat16, torch.float32, HEAD_DIM
    if ph.kv_heads < 1 or ph.heads % ph.kv_heads or ph.heads // ph.kv_heads > GROUP_MAX:
        raise ValueError(f"attention needs heads / kv_heads in 1..{GROUP_MAX}, got {ph.heads}/{ph.kv_heads}")
    if ph.splits < 1:
        raise ValueError(f"attention splits must be positive, got {ph.splits}")
    want = {
        "qkv": (bf, (ph.heads + 2 * ph.kv_heads) * hd),
        "y": (bf, ph.heads * hd),
        "cos": (f32, hd // 2),
        "sin": (f32, hd // 2),
        "part": (f32, ph.heads * ph.splits * (hd + 2)),
    }
    if ph.q_norm_w is not None or ph.k_norm_w is not None:
        want |= {"q_norm_w": (bf, hd), "k_norm_w": (bf, hd)}
    for name, (dtype, numel) in want.items():
        t = getattr(ph, name)
        if t is None or t.dtype != dtype or t.numel() < numel or not t.is_contiguous():
            raise ValueError(
                f"stream attention: {name} must be a contiguous {dtype} tensor of at least {numel} values"
            )
    kv_dtype = ph.k_cache.dtype
    for name in ("k_cache", "v_cache"):
        t = getattr(ph, name)
        if (
            t.dtype not in (bf, torch.float8_e4m3fn)
            or t.dtype != kv_dtype
            or t.dim() != 4
            or t.shape[2:] != (ph.kv_heads, hd)
            or not t.is_contiguous()
        ):
            raise ValueError(
                f"stream attention: {name} must be contiguous bf16 or float8_e4m3fn [blocks, block_size, "
                f"{ph.kv_heads}, {hd}], both caches of one dtype"
            )
    if ph.kv_fp8 and not (ph.k_scale > 0.0 and ph.v_scale > 0.0):
        raise ValueError(
            f"stream attention: k_scale and v_scale must be positive, got {ph.k_scale}, {ph.v_scale}"
        )
    if ph.cos.shape != ph.sin.shape or ph.cos.dim() != 2 or ph.cos.shape[1] != hd // 2:
        raise ValueError(f"stream attention: cos and sin must be float32 [positions, {hd // 2}]")


_ROW = 29  # int64 words of the kernel's Phase struct


def pack_phases(phases: Sequence[StreamPhase | StreamAttention]) -> torch.Tensor:
    """The launch table: int64 ``[len(phases), 29]`` on the phases' device, one row per phase
    laid out as the kernel's ``Phase`` struct: eleven pointers; ``n | k << 32``;
    ``kind | epilogue << 32``; ``y_bf16 | eps << 32`` (float32 bits); then seven attention
    pointers (``k_cache, v_cache, cos, sin, q_norm_w, k_norm_w, part``), ``op | heads << 32``,
    ``kv_heads | block_size << 32``, ``splits | qk_norm << 32``, ``scale | qk_eps << 32``,
    ``k_scale | v_scale << 32``, ``1 / k_scale | 1 / v_scale << 32`` (float32 bits; 1 for a
    bf16 cache), ``kv_fp8`` (GEMV phases: zeros); last, ``block_n | 128 << 32`` for block-scaled
    weights (:attr:`StreamPhase.block_n`; zero otherwise). Raises ``ValueError`` on a bad phase, or when a phase reads the
    statistics buffer it writes."""

    def ptr(t: torch.Tensor | None) -> int:
        return 0 if t is None else int(t.data_ptr())

    def f32_bits(v: float) -> int:
        return int(struct.unpack("<I", struct.pack("<f", v))[0])

    rows = []
    device = None
    for i, ph in enumerate(phases):
        if isinstance(ph, StreamAttention):
            check_attention(ph)
            device = device or ph.qkv.device
            row = [0, 0, ptr(ph.qkv), 0, 0, 0, ptr(ph.y), 0, 0, 0, 0, 0, 0, 0]
            row += [
                ptr(t) for t in (ph.k_cache, ph.v_cache, ph.cos, ph.sin, ph.q_norm_w, ph.k_norm_w, ph.part)
            ]
            row += [
                OP_ATTEND | (ph.heads << 32),
                ph.kv_heads | (int(ph.k_cache.shape[1]) << 32),
                ph.splits | (int(ph.q_norm_w is not None) << 32),
                f32_bits(ph.scale) | (f32_bits(ph.qk_eps) << 32),
            ]
            ks, vs = (ph.k_scale, ph.v_scale) if ph.kv_fp8 else (1.0, 1.0)
            row += [
                f32_bits(ks) | (f32_bits(vs) << 32),
                f32_bits(1.0 / ks) | (f32_bits(1.0 / vs) << 32),
                int(ph.kv_fp8),
                0,
            ]
            rows.append(row)
            continue
        check_phase(ph)
        device = device or ph.weight.device
        if (
            ph.stats_out is not None
            and ph.stats_in is not None
            and ph.stats_out.data_ptr() == ph.stats_in.data_ptr()
        ):
            raise ValueError(f"stream phase {i} writes the statistics buffer it reads")
        y_bf16 = int(ph.y is not None and ph.y.dtype == torch.bfloat16)
        tensors = (ph.weight, ph.weight_scale, ph.x, ph.norm_w, ph.copy_out, ph.stats_in, ph.y)
        tensors += (ph.res_in, ph.res_out, ph.next_norm_w, ph.stats_out)
        row = [ptr(t) for t in tensors]
        row += [ph.n | (ph.k << 32), ph.kind | (ph.epilogue << 32), y_bf16 | (f32_bits(ph.eps) << 32)]
        row += [0] * (_ROW - 1 - len(row))
        bn = ph.block_n
        rows.append([*row, bn | ((WEIGHT_BLOCK_K if bn else 0) << 32)])
    return torch.tensor(rows, dtype=torch.int64).to(device)


def stream_input(ph: StreamPhase, x0: torch.Tensor | None = None) -> torch.Tensor:
    """Phase ``ph``'s input as the kernel builds it, in float32 before its fp16 rounding
    (``[k]``). ``x0`` replaces ``x``, as the launch's ``x0`` argument does for its first phase.
    (The kernel takes the STATS kinds' sum of squares and maximum from the previous epilogue;
    here they are computed from ``x``: the same up to float32 summation order.)"""
    bf = torch.bfloat16
    x = (x0 if x0 is not None else ph.x).reshape(-1)[: ph.k].float()
    if ph.kind in (KIND_INPUT, KIND_STATS):
        return x
    assert ph.norm_w is not None
    inv = torch.rsqrt(x.pow(2).mean() + ph.eps)
    return (ph.norm_w.float() * (x * inv).to(bf).float()).to(bf).float()


def stream_epilogue(ph: StreamPhase, out: torch.Tensor) -> None:
    """Phase ``ph``'s epilogue in torch over its float32 products ``out`` (``[n]``): writes
    ``y`` and ``res_out`` as the kernel does (statistics are the kernel's own business)."""
    bf = torch.bfloat16
    if ph.epilogue == EPI_SILU:
        assert ph.y is not None
        g, u = out[: ph.n // 2].to(bf).float(), out[ph.n // 2 :].to(bf).float()
        a = (g / (1 + torch.exp(-g))).to(bf).float()
        ph.y.reshape(-1).copy_((a * u).to(bf))
        return
    if ph.epilogue == EPI_ADD:
        assert ph.res_in is not None and ph.res_out is not None
        h = ph.res_in.reshape(-1)[: ph.n].float() + out.to(bf).float()
        ph.res_out.reshape(-1)[: ph.n].copy_(h.to(bf))
    if ph.y is not None:
        ph.y.reshape(-1).copy_(out.to(ph.y.dtype))


def attention_reference(ph: StreamAttention, meta: StreamMeta) -> None:
    """What an attention phase computes, in torch (the tests' reference): q/k RMSNorm and
    rotary with the model's bf16 roundings (as :class:`surge.layers.norm.RMSNorm` and
    :class:`surge.layers.rotary.RotaryEmbedding`), the new K/V written at the slot (none at slot
    -1), and the whole attention written to ``y`` (scores and softmax in float32)."""
    bf, hd = torch.bfloat16, HEAD_DIM
    h, hk = ph.heads, ph.kv_heads
    qkv = ph.qkv.reshape(-1)[: (h + 2 * hk) * hd]
    q = qkv[: h * hd].view(h, hd)
    k = qkv[h * hd : (h + hk) * hd].view(hk, hd)
    v = qkv[(h + hk) * hd :].view(hk, hd)

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ph.qk_eps)
        return w * xf.to(bf)

    if ph.q_norm_w is not None and ph.k_norm_w is not None:
        q, k = norm(q, ph.q_norm_w), norm(k, ph.k_norm_w)
    pos = int(meta.positions.reshape(-1)[0])
    cos, sin = ph.cos[pos].to(bf), ph.sin[pos].to(bf)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    q, k = rotate(q), rotate(k)
    slot = int(meta.slot_mapping.reshape(-1)[0])
    bs = ph.k_cache.shape[1]
    ks, vs = (ph.k_scale, ph.v_scale) if ph.kv_fp8 else (1.0, 1.0)
    if ph.kv_fp8:  # stored as e4m3, and the attention reads the stored values
        k, v = quantize_kv(k, ks), quantize_kv(v, vs)
    if slot >= 0:  # -1: a padding token writes nothing
        ph.k_cache.view(-1, hk, hd)[slot] = k
        ph.v_cache.view(-1, hk, hd)[slot] = v
    n = int(meta.seq_lens.reshape(-1)[0])
    blocks = meta.block_table[0].long()
    t = torch.arange(n - 1, device=blocks.device)
    slots = blocks[t // bs] * bs + t % bs
    # the cached context, then the new token's own K/V (as the kernel takes them)
    keys = torch.cat((ph.k_cache.view(-1, hk, hd)[slots], k[None])).float() * ks  # [n, hk, hd]
    vals = torch.cat((ph.v_cache.view(-1, hk, hd)[slots], v[None])).float() * vs
    group = h // hk
    kk = keys.repeat_interleave(group, dim=1)  # [n, h, hd]
    vv = vals.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,nhd->hn", q.float(), kk) * ph.scale
    out = torch.einsum("hn,nhd->hd", scores.softmax(-1), vv)
    ph.y.reshape(-1)[: h * hd].copy_(out.reshape(-1).to(bf))


def stream_reference(
    phases: Sequence[StreamPhase | StreamAttention],
    x0: torch.Tensor | None = None,
    meta: StreamMeta | None = None,
) -> None:
    """What :func:`stream_decode` computes, in torch (the tests' reference and the CPU path):
    runs the phases in order, writing each ``y``, ``res_out`` and ``copy_out`` in place (and,
    for attention phases, the caches: :func:`attention_reference`, with ``meta``). The
    input is rounded to fp16 after the same power-of-two scaling as the kernel's; products are
    summed in float32 (the kernel sums eight at a time in fp16).

    Raises:
        ValueError: an attention phase without ``meta``.
    """
    for i, ph in enumerate(phases):
        if isinstance(ph, StreamAttention):
            if meta is None:
                raise ValueError("attention phases need the step's StreamMeta")
            attention_reference(ph, meta)
            continue
        src = x0 if i == 0 else None
        x = stream_input(ph, src)
        if ph.kind == KIND_NORM and ph.copy_out is not None:
            ph.copy_out.reshape(-1)[: ph.k].copy_((src if src is not None else ph.x).reshape(-1)[: ph.k])
        bound = float(x.abs().max()) * 1.0001
        e = 0 if bound == 0 else max(-40, min(40, math.ceil(math.log2(bound / 16))))
        xh = (x * 2.0**-e).half().float()
        bn = ph.block_n
        if bn:  # each block's scale on its weights; the kernel applies it to 16-product sums
            sc = ph.weight_scale.float().repeat_interleave(bn, 0).repeat_interleave(WEIGHT_BLOCK_K, 1)
            stream_epilogue(ph, (ph.weight.float() * sc) @ xh * 2.0**e)
        else:
            acc = ph.weight.float() @ xh
            stream_epilogue(ph, acc * ph.weight_scale.float() * 2.0**e)


def phase_timeline(stamps: torch.Tensor, launch_starts: set[int]) -> list[dict[str, float]]:
    """What a :attr:`StreamDecodeKernel.trace` build's stamps say about each phase of a step.

    Args:
        stamps: int64 ``[P, G, 4]``, nanoseconds of the GPU's global timer: per phase and block,
            when the block was released by the barrier (or the launch began), had built its
            input, had done its rows, and had arrived at the next barrier.
        launch_starts: the phases that begin a launch (their wait includes the kernel before).

    Returns:
        Per phase, in microseconds: ``build`` and ``rows`` (medians over blocks), ``rows_max``
        (the slowest block's rows), ``tail`` (the last arrival after the median one), ``wait``
        (median release after the previous phase's last arrival: the barrier's latency, or for
        a launch's first phase the kernel between and the launch), ``span`` (last arrival after
        the previous phase's last arrival; for phase 0 after its first release).
    """
    t = stamps.to(torch.float64) / 1e3
    out = []
    for p in range(t.shape[0]):
        released, built, done, arrived = t[p, :, 0], t[p, :, 1], t[p, :, 2], t[p, :, 3]
        prev_last = float(t[p - 1, :, 3].max()) if p else float(released.min())
        out.append(
            {
                "build": float((built - released).median()),
                "rows": float((done - built).median()),
                "rows_max": float((done - built).max()),
                "tail": float(arrived.max() - arrived.median()),
                "wait": float(released.median()) - prev_last if p else 0.0,
                "span": float(arrived.max()) - prev_last,
                "launch_start": float(p in launch_starts),
            }
        )
    return out


@dataclass
class StreamDecodeKernel:
    """The compiled kernel of one device and its launch state.

    Attributes:
        device: the CUDA device.
        counter: int32 ``[HEADS_DONE + STATS_LEN // 2]``: ``[0]`` the grid barrier's arrivals,
            ``[HEADS_DONE + h]`` those of KV head ``h``'s attention shares; zero it once per
            step (:meth:`reset`) and pass each launch its first phase's index in the step.
        num_sms: blocks per launch (one per multiprocessor).
        pdl: launch with programmatic dependent launch (sm90+, through the driver's
            ``cuLaunchKernelEx``): each launch may start while the previous kernel in the
            stream (the attention) finishes, with its first weight segments in flight; the
            kernel waits for that kernel's writes (``griddepcontrol.wait``) before reading
            anything else. Set by :meth:`compile` where it works; off, launches are ordinary.
        trace: a diagnostic build that stamps each phase's timeline into the ``trace`` buffer
            of :meth:`launch` (see :func:`phase_timeline`).
        kv_fp8: the build whose attention phases read FP8 (e4m3) caches; the other reads bf16
            ones. (Both in one build spill registers.) A launch whose table has attention
            phases of the other dtype computes no attention and leaves :meth:`hung` true.
        block_scaled: the build for block-scaled weights (FP8 checkpoints' ``weight_block_size``;
            :attr:`StreamPhase.block_n`); the other takes one scale per row. Each takes only its
            own layout: one build with both made the per-row layers 13 % slower (74.5 against 65.7 us
            per Qwen3-8B layer on an H200, 88.4 against 83.2 on an H100;
            ``benchmarks/stream_decode_bench.py --layers 36``). A phase of the other layout
            leaves :meth:`hung` true.
    """

    device: torch.device
    counter: torch.Tensor
    num_sms: int
    pdl: bool = False
    trace: bool = False
    kv_fp8: bool = False
    block_scaled: bool = False
    _fn: Any = dataclasses.field(repr=False, default=None)

    @classmethod
    def compile(
        cls, device: torch.device, trace: bool = False, kv_fp8: bool = False, block_scaled: bool = False
    ) -> StreamDecodeKernel:
        """NVRTC-compiles the kernel for ``device`` (the diagnostic build if ``trace``; attention
        over FP8 caches if ``kv_fp8``, else bf16; block-scaled weights too if ``block_scaled``) and runs
        :meth:`self_test`. Raises ``RuntimeError`` where it cannot (no NVRTC, a GPU older than
        sm89, more than 1024 multiprocessors, a compile error, a failed self-test)."""
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise RuntimeError(f"stream decode needs sm89+ (e4m3 conversion), not sm{major}{minor}")
        compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
        if compile_kernel is None:
            raise RuntimeError("this torch has no torch.cuda._compile_kernel (NVRTC)")
        props = torch.cuda.get_device_properties(device)
        if 2 * props.multi_processor_count > STATS_LEN:
            raise RuntimeError(f"stream decode supports up to {STATS_LEN // 2} multiprocessors")
        with torch.cuda.device(device):
            defines = (
                f"#define MIN_SPLIT_TOKENS {MIN_SPLIT_TOKENS}\n#define HEADS_DONE {HEADS_DONE}\n"
                f"#define KV_FP8 {int(kv_fp8)}\n#define BLOCK_SCALED {int(block_scaled)}\n"
            )
            fn = compile_kernel(("#define TRACE\n" if trace else "") + defines + _SOURCE, "stream_decode")
        counter = torch.zeros(HEADS_DONE + STATS_LEN // 2, dtype=torch.int32, device=device)
        pdl = major >= 9 and _pdl_launcher() is not None and getattr(fn, "func", None) is not None
        kernel = cls(
            device=device,
            counter=counter,
            num_sms=props.multi_processor_count,
            pdl=pdl,
            trace=trace,
            kv_fp8=kv_fp8,
            block_scaled=block_scaled,
            _fn=fn,
        )
        kernel.self_test()
        return kernel

    def self_test(self) -> None:
        """Run a small chain of every input kind and epilogue (norm -> SwiGLU pairs -> residual add ->
        norm from statistics, with grid barriers between them; block-scaled weights in the
        :attr:`block_scaled` build, 16x apart in magnitude between blocks) and compare it with
        :func:`stream_reference`. Raises ``RuntimeError`` when a barrier timed out (the blocks are
        not all resident at once: another kernel or an SM limit such as MPS holds some
        multiprocessors) or the results differ; called by :meth:`compile`."""
        dev, bf = self.device, torch.bfloat16
        g = torch.Generator(device="cpu").manual_seed(0)
        k, inter, n = 512, 384, 4 * self.num_sms + 3

        def weight(rows: int, cols: int, bn: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
            w = torch.randn(rows, cols, generator=g) * cols**-0.5
            if not self.block_scaled:
                q, s = quantize_per_channel(w)
                return q.to(dev), s.to(dev)
            # bn x 128 blocks 16x apart in magnitude, so that a scale taken from the wrong block shows
            mag = 2.0 ** torch.randint(-2, 3, (rows // bn, cols // WEIGHT_BLOCK_K), generator=g).float()
            w = w * mag.repeat_interleave(bn, 0).repeat_interleave(WEIGHT_BLOCK_K, 1)
            q, s = quantize_block(w, (bn, WEIGHT_BLOCK_K))
            return q.to(dev), s.to(dev)

        def vec(size: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
            return (shift + scale * torch.randn(size, generator=g)).to(bf).to(dev)

        def nan(size: int, dtype: torch.dtype = bf) -> torch.Tensor:
            return torch.full((size,), float("nan"), dtype=dtype, device=dev)

        x, res_in, nw1, nw2 = vec(k), vec(k), vec(k, 0.1, 1.0), vec(k, 0.1, 1.0)
        copy, act, res_out, out = nan(k), nan(inter), nan(k), nan(n, torch.float32)
        stats = [torch.zeros(STATS_LEN, device=dev) for _ in range(2)]
        phases = [
            StreamPhase(
                *weight(2 * inter, k),
                KIND_NORM,
                act,
                x,
                nw1,
                copy_out=copy,
                epilogue=EPI_SILU,
                stats_out=stats[0],
            ),
            StreamPhase(
                *weight(k, inter),
                KIND_STATS,
                None,
                act,
                stats_in=stats[0],
                epilogue=EPI_ADD,
                res_in=res_in,
                res_out=res_out,
                next_norm_w=nw2,
                stats_out=stats[1],
            ),
            StreamPhase(*weight(n, k, bn=1), KIND_NORM_STATS, out, res_out, nw2, stats_in=stats[1]),
        ]
        self.reset()
        stamps = (
            torch.zeros(len(phases), self.num_sms, 4, dtype=torch.int64, device=dev) if self.trace else None
        )
        self.launch(pack_phases(phases), 0, trace=stamps)
        torch.cuda.synchronize(dev)
        if self.hung():
            raise RuntimeError("self-test: a grid barrier timed out (not every block was resident)")
        got = out.clone()
        stream_reference(phases)
        cos = float(torch.nn.functional.cosine_similarity(got, out, dim=0))
        if not cos > 0.9999:
            raise RuntimeError(
                f"self-test: the kernel's output differs from the reference (cosine {cos:.6f})"
            )

    def reset(self) -> None:
        """Zero the barrier and attention counters (once per step, before its first launch)."""
        self.counter.zero_()

    def hung(self) -> bool:
        """Whether a barrier timed out since the last :meth:`reset` (blocks not co-resident);
        synchronizes."""
        return bool(int(self.counter[0].item()) & _HANG)

    def launch(
        self,
        table: torch.Tensor,
        phase_base: int,
        x0: torch.Tensor | None = None,
        trace: torch.Tensor | None = None,
        meta: StreamMeta | None = None,
    ) -> None:
        """Run the phases of ``table`` (rows of :func:`pack_phases`) on the current stream.

        Args:
            table: int64 ``[P, 29]``, a contiguous slice of a packed table.
            phase_base: how many phases of this step ran before (the counter's offset).
            x0: overrides the first phase's ``x``; bf16 ``[k]``, contiguous.
            trace: int64 ``[phases of the step, num_sms, 4]`` on the device, where a
                :attr:`trace` build stamps its timeline (ignored otherwise).
            meta: the step's layout, which the table's attention phases read (required when
                it has any; their tensors' addresses are what a CUDA graph captures).

        Raises:
            ValueError: a :attr:`trace` build without a large enough ``trace`` buffer.
        """
        x = x0 if x0 is not None else table
        if self.trace and (
            trace is None
            or trace.dtype != torch.int64
            or trace.device.type != self.device.type
            or (self.device.index is not None and trace.device.index != self.device.index)
            or not trace.is_contiguous()
            or trace.numel() < (phase_base + table.shape[0]) * self.num_sms * 4
        ):
            raise ValueError(
                "a trace build needs a contiguous int64 [phases, num_sms, 4] trace buffer on its device"
            )
        stamps = trace if trace is not None else self.counter  # never written unless traced
        # without attention phases the kernel never reads these: any device address will do
        m = (
            (meta.seq_lens, meta.block_table, meta.slot_mapping, meta.positions)
            if meta is not None
            else (self.counter,) * 4
        )
        if self.pdl:
            _launch_pdl(
                self._fn.func, self.num_sms, table, self.counter, phase_base, x, x0 is not None, stamps, m
            )
            return
        args = [table, int(table.shape[0]), self.counter, phase_base, x, int(x0 is not None), stamps, *m]
        self._fn(grid=(self.num_sms, 1, 1), block=(_WARPS * 32, 1, 1), args=args, shared_mem=_SMEM)


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: a CUlaunchAttributeID, 4 bytes of padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):
    # CUlaunchConfig (cuda.h)
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


@functools.cache
def _pdl_launcher() -> Any:
    """The driver's ``cuLaunchKernelEx`` (CUDA 12+), or None where there is none."""
    try:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


def _launch_pdl(
    func: Any,
    blocks: int,
    table: torch.Tensor,
    counter: torch.Tensor,
    base: int,
    x: torch.Tensor,
    use_x0: bool,
    trace: torch.Tensor,
    meta: tuple[torch.Tensor, ...],
) -> None:
    """One launch of the kernel ``func`` (a CUfunction) on the current stream with the
    programmatic-stream-serialization attribute. Raises ``RuntimeError`` on a driver error."""
    attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value = struct.pack("<i", 1)  # programmaticStreamSerializationAllowed
    cfg = _LaunchConfig()
    cfg.grid[:] = (blocks, 1, 1)
    cfg.block[:] = (_WARPS * 32, 1, 1)
    cfg.shared_mem = _SMEM
    cfg.stream = torch.cuda.current_stream().cuda_stream
    cfg.attrs = ctypes.pointer(attr)
    cfg.num_attrs = 1
    values = (
        ctypes.c_void_p(table.data_ptr()),
        ctypes.c_int(int(table.shape[0])),
        ctypes.c_void_p(counter.data_ptr()),
        ctypes.c_int(base),
        ctypes.c_void_p(x.data_ptr()),
        ctypes.c_int(int(use_x0)),
        ctypes.c_void_p(trace.data_ptr()),
        *(ctypes.c_void_p(t.data_ptr()) for t in meta),
    )
    params = (ctypes.c_void_p * len(values))(
        *(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values)
    )
    func_ptr = func.value if isinstance(func, ctypes.c_void_p) else func
    err = _pdl_launcher()(ctypes.byref(cfg), func_ptr, params, None)
    if err != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUDA error {err}")
