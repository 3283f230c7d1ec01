"""Probe: can the stream kernel's GEMV phases serve decode steps of 2-16 tokens on tensor cores?

The persistent stream kernel (:mod:`surge.kernels.stream_decode`) runs one-token steps: each
lane takes 16 weight bytes of one row and dots them with 16 fp16 inputs from shared memory on
CUDA cores (``fma.rn.f16x2``). At ``M`` tokens that inner loop reads ``M`` times the inputs from
shared memory per weight byte; at ``M = 4`` the H200's 128 bytes per clock and multiprocessor
are about used up by the input reads alone (16.4 weight bytes per clock and multiprocessor at
4.3 TB/s over 132 of them, times 8), so steps of 2-16 tokens stay on the Triton split-K chain
(C4/C16 TPOT 3.3-3.7 ms against 2.98 ms at C1 in session 29's FP8 matrix).

This probe's kernel streams the same weights through ``mma.sync.aligned.m16n8k32`` with e4m3
operands (sm89+): a warp takes 16 rows x 256 bytes of ``K`` per task (lane ``(g, t) = (lane / 4,
lane % 4)`` loads 4 x 16 bytes of rows ``g`` and ``g + 8``: the A fragments as they come from
memory, no conversion), and the tokens are the MMA's ``N = 8`` columns (two tiles for 16): the
inputs are quantized per token to e4m3 in shared memory (w8a8, as the Triton chain does at these
sizes), one 16-byte shared load per lane and 32 weight bytes. A ``K`` permutation shared by A
and B lets each lane feed the MMA with the bytes it loaded. Tasks of a phase go round robin over
the block's warps (about 3-12 per warp), partial sums of a 16-row tile go to a shared float
buffer by ``atomicAdd``, and after a block barrier the epilogue scales each ``(row, token)`` and
stores it with the next phase's per-token statistics (sum of squares, largest ``|y|``). Phases
are separated by grid barriers; every warp keeps its next task's 4 KiB in flight across them, as
the stream kernel does.

Each phase computes, per token ``m``, ``y_m = W (x_m * rsqrt(mean(y_prev,m^2) + 1e-6))`` over
the first ``K`` values of the previous phase's output ``y_prev,m``, with ``x`` quantized by
``448 / max|y_prev,m|``. The same 36 Qwen3-8B-shaped layers x (qkv, o, gate_up, down) as
``cuda_stream_probe.py`` (6.95 GB of distinct e4m3 weights) run for ``--tokens`` (one NVRTC build
per variant), as one launch for the whole step and as one launch per layer with a 512 KiB copy
between launches standing in for attention. Every phase kind is first checked against float32
torch from the kernel's own inputs. Variants:

* ``--inputs``: the phases' outputs (the next inputs) in bf16 or float32;
* ``--build block``: the whole block reduces the statistics, then builds all of ``x`` (two L2
  round trips and two block barriers); ``--build warp`` (bf16): each warp loads only the ``K``
  chunks its own tasks read (the same for every tile, as ``K / 256`` is a multiple of the 16
  warps) while the statistics are reduced, and quantizes them after one block barrier;
* ``--smem``: ask for at least this much dynamic shared memory per block, which shrinks L1.

Timing-only mode bits (wrong results by design): 4 leaves out the MMAs, 8 the input builds, 16
the epilogue's stores.

    python3 benchmarks/mma_stream_probe.py --json out.jsonl      # sm90 GPU host (NVRTC via torch)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

NW = 16
KC = 256
XMAX = 12288
XS = XMAX + 64  # bytes per token row of the quantized inputs (a 64-byte shift: no bank conflicts)
ACC_ROWS = 256
HIDDEN, QKV, INTER = 4096, 6144, 12288
# (name, n, k): each phase reads the first k values of the previous phase's n outputs
PHASES = (
    ("qkv", QKV, HIDDEN),
    ("o", HIDDEN, HIDDEN),
    ("gate_up", 2 * INTER, HIDDEN),
    ("down", HIDDEN, INTER),
)
NMAX = 2 * INTER

_SOURCE = r"""
#if !defined(MT) || !defined(XBF16) || !defined(WARP_BUILD)
#error "MT (tokens), XBF16 (bf16 outputs and inputs, else float32) and WARP_BUILD are defined by the probe"
#endif
#if WARP_BUILD && !XBF16
#error "WARP_BUILD reads bf16 inputs"
#endif
#define NW 16
#define THREADS (NW * 32)
#define KC 256
#define XMAX 12288
#define XS (XMAX + 64)
#define ACC_ROWS 256
#define NT ((MT + 7) / 8)
#define WB_MAX (XMAX / KC / NW)  // chunks of x one warp builds (WARP_BUILD)
#define HANG (1u << 30)
#define MAX_POLLS (1u << 26)
typedef unsigned long long u64;
struct __align__(16) U4 { unsigned x, y, z, w; };
struct Phase { u64 w, w_scale, x, y, stats_in, stats_out; int n, k, n_prev, ld; };
struct Task { int p, id; };

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void block_sync() { asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory"); }
__device__ __forceinline__ int row0_of(const Phase& d, int cta, int G) {
  return (int)((unsigned)d.n * (unsigned)cta / (unsigned)G);
}
__device__ __forceinline__ int rows_of(const Phase& d, int cta, int G) {
  return row0_of(d, cta + 1, G) - row0_of(d, cta, G);
}
__device__ __forceinline__ int tasks_of(const Phase& d, int cta, int G) {
  return ((rows_of(d, cta, G) + 15) / 16) * (d.k / KC);
}
__device__ __forceinline__ bool seek(Task& t, const Phase* ph, int np, int cta, int G, int warp) {
  while (t.p < np) {
    if (t.id < tasks_of(ph[t.p], cta, G)) return true;
    ++t.p;
    t.id = warp;
  }
  return false;
}
// A task: rows [tile * 16, tile * 16 + 16) of the block's, K bytes [chunk * KC, chunk * KC + KC).
// Lane (g, t) loads bytes 64 i + 16 t .. + 16 (i < 4) of rows g (r[i]) and g + 8 (r[4 + i]).
__device__ __forceinline__ void load_task(U4 (&r)[8], const Phase* ph, const Task& t, int cta, int G, int lane) {
  const Phase& d = ph[t.p];
  const int nch = d.k / KC, tile = t.id / nch, chunk = t.id % nch;
  const int rows = rows_of(d, cta, G), g = lane >> 2, tq = lane & 3;
  const long long r0 = row0_of(d, cta, G) + tile * 16;
  const unsigned char* base = reinterpret_cast<const unsigned char*>(d.w) + (long long)chunk * KC + 16 * tq;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rr = tile * 16 + g + 8 * h;
    const unsigned char* src = base + (r0 + g + 8 * h) * (long long)d.k;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      U4& v = r[4 * h + i];
      v.x = v.y = v.z = v.w = 0u;
      if (rr < rows)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(src + 64 * i));
    }
  }
}
__device__ __forceinline__ void mma(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                    unsigned b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned e4m3x4(float a, float b, float c, float d) {
  unsigned short lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
  return (unsigned)lo | ((unsigned)hi << 16);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
mma_stream(const Phase* __restrict__ phases, int num_phases, unsigned* counter, int phase_base, int mode) {
  extern __shared__ __align__(16) unsigned char dyn[];
  unsigned char* xs = dyn;                                          // [MT][XS] e4m3 inputs
  float* acc_s = reinterpret_cast<float*>(dyn + MT * XS);          // [ACC_ROWS][MT]
  __shared__ float deq[MT], mult[MT];
  __shared__ float red[NW][MT][2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int G = gridDim.x, cta = blockIdx.x, g = lane >> 2, tq = lane & 3;
  Task nt{0, warp};
  bool have = seek(nt, phases, num_phases, cta, G, warp);
  U4 nb[8];
  if (have) load_task(nb, phases, nt, cta, G, lane);
  for (int p = 0; p < num_phases; ++p) {
    const Phase& d = phases[p];
    if (p > 0) {
      if (tid == 0) {
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
      }
      block_sync();
    }
    const int k = d.k, nch = k / KC, rows = rows_of(d, cta, G), r0 = row0_of(d, cta, G);
#if WARP_BUILD
    // this warp's chunks of x (w, w + NW, ...: its tasks' chunks, as nch % NW == 0), every
    // token, in flight while the statistics are reduced
    uint4 xr[WB_MAX][MT];
    const unsigned short* xw = reinterpret_cast<const unsigned short*>(d.x);
#pragma unroll
    for (int q = 0; q < WB_MAX; ++q) {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int ch = warp + NW * q;
        xr[q][m] = make_uint4(0u, 0u, 0u, 0u);
        if (ch < nch && !(mode & 8))
          xr[q][m] = __ldcg(reinterpret_cast<const uint4*>(xw + (long long)m * d.ld + ch * KC) + lane);
      }
    }
#endif
    // input build: per-token statistics of the previous phase (one pair per block), then x
    // quantized per token into shared memory
    if (warp < MT) {
      const float2* st = reinterpret_cast<const float2*>(d.stats_in);
      float ss = 0.f, am = 0.f;
      float2 v[5];
#pragma unroll
      for (int j = 0; j < 5; ++j) {
        const int c = lane + 32 * j;
        v[j] = c < G ? __ldcg(st + c * MT + warp) : make_float2(0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < 5; ++j) {
        ss += v[j].x;
        am = fmaxf(am, v[j].y);
      }
      for (int c = lane + 160; c < G; c += 32) {
        const float2 u = __ldcg(st + c * MT + warp);
        ss += u.x;
        am = fmaxf(am, u.y);
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) {
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
      }
      if (lane == 0) {
        const float inv = rsqrtf(ss / (float)d.n_prev + 1e-6f);
        const float a = am > 0.f ? am : 1.f;
        mult[warp] = 448.f / a;
        deq[warp] = a * inv / 448.f;
      }
    }
    for (int i = tid; i < ((rows + 15) & ~15) * MT; i += THREADS) acc_s[i] = 0.f;
    block_sync();
#if WARP_BUILD
#pragma unroll
    for (int q = 0; q < WB_MAX; ++q) {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const int ch = warp + NW * q;
        if (ch < nch && !(mode & 8)) {
          const float f = mult[m];
          const uint4 v = xr[q][m];
          *reinterpret_cast<uint2*>(xs + m * XS + ch * KC + 8 * lane) = make_uint2(
              e4m3x4(__uint_as_float(v.x << 16) * f, __uint_as_float(v.x & 0xffff0000u) * f,
                     __uint_as_float(v.y << 16) * f, __uint_as_float(v.y & 0xffff0000u) * f),
              e4m3x4(__uint_as_float(v.z << 16) * f, __uint_as_float(v.z & 0xffff0000u) * f,
                     __uint_as_float(v.w << 16) * f, __uint_as_float(v.w & 0xffff0000u) * f));
        }
      }
    }
    __syncwarp();
#else
    if (!(mode & 8)) {
#if XBF16
      const unsigned short* xin = reinterpret_cast<const unsigned short*>(d.x);
      const int per = k / 4;  // 8-byte units (4 bf16) per token
      for (int e0 = tid; e0 < MT * per; e0 += THREADS * 8) {
        uint2 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int e = e0 + j * THREADS;
          v[j] = make_uint2(0u, 0u);
          if (e < MT * per) v[j] = __ldcg(reinterpret_cast<const uint2*>(xin + (long long)(e / per) * d.ld) + e % per);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int e = e0 + j * THREADS;
          if (e < MT * per) {
            const int m = e / per;
            const float f = mult[m];
            *reinterpret_cast<unsigned*>(xs + m * XS + 4 * (e % per)) =
                e4m3x4(__uint_as_float(v[j].x << 16) * f, __uint_as_float(v[j].x & 0xffff0000u) * f,
                       __uint_as_float(v[j].y << 16) * f, __uint_as_float(v[j].y & 0xffff0000u) * f);
          }
        }
      }
#else
      const float* xin = reinterpret_cast<const float*>(d.x);
      const int per = k / 4;  // float4 units per token
      for (int e0 = tid; e0 < MT * per; e0 += THREADS * 8) {
        float4 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int e = e0 + j * THREADS;
          v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (e < MT * per) v[j] = __ldcg(reinterpret_cast<const float4*>(xin + (long long)(e / per) * d.ld) + e % per);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int e = e0 + j * THREADS;
          if (e < MT * per) {
            const int m = e / per;
            const float f = mult[m];
            *reinterpret_cast<unsigned*>(xs + m * XS + 4 * (e % per)) =
                e4m3x4(v[j].x * f, v[j].y * f, v[j].z * f, v[j].w * f);
          }
        }
      }
#endif
    }
    block_sync();
#endif
    float c[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
    int cur_tile = -1;
    while (have && nt.p == p) {
      U4 cb[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) cb[q] = nb[q];
      const int id = nt.id;
      nt.id += NW;
      have = seek(nt, phases, num_phases, cta, G, warp);
      if (have) load_task(nb, phases, nt, cta, G, lane);
      const int tile = id / nch, chunk = id % nch;
      if (tile != cur_tile) {
        if (cur_tile >= 0) {
#pragma unroll
          for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int row = cur_tile * 16 + g + 8 * (e >> 1), tok = 8 * n + 2 * tq + (e & 1);
              if (tok < MT && row < rows) atomicAdd(acc_s + row * MT + tok, c[n][e]);
              c[n][e] = 0.f;
            }
          }
        }
        cur_tile = tile;
      }
      if (!(mode & 4)) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int off = chunk * KC + 64 * i + 16 * tq;
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            const int tok = 8 * n + g;
            U4 b = {0u, 0u, 0u, 0u};
            if (tok < MT) b = *reinterpret_cast<const U4*>(xs + tok * XS + off);
            mma(c[n], cb[i].x, cb[4 + i].x, cb[i].y, cb[4 + i].y, b.x, b.y);
            mma(c[n], cb[i].z, cb[4 + i].z, cb[i].w, cb[4 + i].w, b.z, b.w);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) c[0][0] += __int_as_float(cb[i].x & 1u);
      }
    }
    if (cur_tile >= 0) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = cur_tile * 16 + g + 8 * (e >> 1), tok = 8 * n + 2 * tq + (e & 1);
          if (tok < MT && row < rows) atomicAdd(acc_s + row * MT + tok, c[n][e]);
        }
      }
    }
    block_sync();
    // epilogue: thread tid keeps token tid % MT (THREADS is a multiple of MT)
    const int m = tid % MT;
    float ss = 0.f, am = 0.f;
#if XBF16
    unsigned short* y = reinterpret_cast<unsigned short*>(d.y);
#else
    float* y = reinterpret_cast<float*>(d.y);
#endif
    const float* ws = reinterpret_cast<const float*>(d.w_scale);
    // the row scales of every item first (one round trip), then the items
    constexpr int PER = (ACC_ROWS * MT + THREADS - 1) / THREADS;
    float wsv[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = tid + j * THREADS;
      wsv[j] = i < rows * MT ? __ldg(ws + r0 + i / MT) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = tid + j * THREADS;
      if (i >= rows * MT || (mode & 16)) break;
      const int r = i / MT;
#if XBF16
      unsigned short h;
      asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(acc_s[i] * wsv[j] * deq[m]));
      const float v = __uint_as_float(((unsigned)h) << 16);
      y[(long long)m * d.ld + r0 + r] = h;
#else
      const float v = acc_s[i] * wsv[j] * deq[m];
      y[(long long)m * d.ld + r0 + r] = v;
#endif
      ss += v * v;
      am = fmaxf(am, fabsf(v));
    }
#pragma unroll
    for (int o = 16; o >= MT; o /= 2) {
      ss += __shfl_xor_sync(0xffffffffu, ss, o);
      am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    }
    if (lane < MT) {
      red[warp][lane][0] = ss;
      red[warp][lane][1] = am;
    }
    block_sync();
    if (tid < MT) {
      float s = 0.f, a = 0.f;
#pragma unroll
      for (int w = 0; w < NW; ++w) {
        s += red[w][tid][0];
        a = fmaxf(a, red[w][tid][1]);
      }
      __stcg(reinterpret_cast<float2*>(d.stats_out) + cta * MT + tid, make_float2(s, a));
    }
    block_sync();
    if (tid == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
    }
  }
}
"""


def smem_bytes(mt: int) -> int:
    """Dynamic shared memory of one block: the quantized inputs and the tile accumulators."""
    return mt * XS + ACC_ROWS * mt * 4


def compile_probe(mt: int, bf16: bool, warp_build: bool, smem: int) -> object:
    """NVRTC-compiles the kernel for ``mt`` tokens, bf16 (else float32) phase outputs and
    per-warp (else per-block) input builds (torch.cuda._compile_kernel)."""
    defines = f"#define MT {mt}\n#define XBF16 {int(bf16)}\n#define WARP_BUILD {int(warp_build)}\n"
    fn = torch.cuda._compile_kernel(defines + _SOURCE, "mma_stream")
    fn.set_shared_memory_config(smem)
    return fn


def main() -> None:
    """Parse the flags (see the module docstring) and run every variant asked for."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument(
        "--inputs",
        nargs="+",
        choices=("bf16", "fp32"),
        default=["bf16", "fp32"],
        help="the phases' output (next input) dtype",
    )
    ap.add_argument(
        "--smem",
        type=int,
        nargs="+",
        default=[0],
        help="dynamic shared memory per block to ask for at least (bytes; 0: what the build needs)",
    )
    ap.add_argument(
        "--build",
        nargs="+",
        choices=("block", "warp"),
        default=["block"],
        help="input builds: the whole block builds all of x, or each warp the chunks its tasks read",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    run(args.layers, args.reps, args.tokens, args.inputs, args.smem, args.build, args.json)


def build_weights(layers: int) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per phase name, ``layers`` distinct ``(e4m3 [n, k], float32 scale [n])`` pairs."""
    out: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for name, n, k in PHASES:
        out[name] = []
        for _ in range(layers):
            w = (torch.randn(n, k, device="cuda") * 64).to(torch.float8_e4m3fn)
            s = (torch.rand(n, device="cuda") + 0.5) / (64 * k**0.5)
            out[name].append((w, s))
    return out


Weights = dict[str, list[tuple[torch.Tensor, torch.Tensor]]]


def run(
    layers: int,
    reps: int,
    tokens: list[int],
    inputs: list[str],
    smems: list[int],
    builds: list[str],
    out: Path | None,
) -> None:
    """Check every phase kind, then time each ``M`` and input dtype; print and append JSON lines."""
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert NMAX // sms <= ACC_ROWS - 16
    assert all(k // KC % NW == 0 and k <= XMAX for _, _, k in PHASES)
    w = build_weights(layers)
    gb = sum(t.numel() for v in w.values() for t, _ in v) / 1e9
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__}; {layers} layers, {gb:.3f} GB e4m3, {sms} SMs"
    )
    variants = [(x, m, s, b) for x in inputs for m in tokens for s in smems for b in builds]
    for xdt, mt, smem, build in variants:
        if build == "warp" and xdt != "bf16":
            continue
        for r in probe_variant(w, layers, reps, sms, mt, xdt, smem, build):
            r["tb_s"] = gb / (r["us_per_layer"] * layers * 1e-6) / 1e3
            print(json.dumps(r), flush=True)
            if out is not None:
                with out.open("a") as f:
                    f.write(json.dumps(r) + "\n")


def probe_variant(
    w: Weights, layers: int, reps: int, sms: int, mt: int, xdt: str, smem_total: int = 0, build: str = "block"
) -> list[dict]:
    """One build (``mt`` tokens, ``xdt`` phase outputs): the per-phase check, then the timings;
    ``smem_total`` asks for at least that much dynamic shared memory per block (bytes), to see
    what a smaller L1 (the rest of the 256 KiB) costs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gemm_bench import time_graph

    smem = max(smem_bytes(mt), smem_total)
    fn = compile_probe(mt, xdt == "bf16", build == "warp", smem)
    bufs = torch.zeros(2, mt, NMAX, device="cuda", dtype=torch.bfloat16 if xdt == "bf16" else torch.float32)
    stats = torch.zeros(2, sms * mt, 2, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    order = list(PHASES)
    rows = []
    for p in range(layers * len(order)):
        name, n, k = order[p % len(order)]
        wt, sc = w[name][p // len(order)]
        n_prev = order[(p - 1) % len(order)][1]
        src, dst = bufs[p % 2], bufs[(p + 1) % 2]
        rows.append(
            [
                wt.data_ptr(),
                sc.data_ptr(),
                src.data_ptr(),
                dst.data_ptr(),
                stats[p % 2].data_ptr(),
                stats[(p + 1) % 2].data_ptr(),
                n | (k << 32),
                n_prev | (NMAX << 32),
            ]
        )
    table = torch.tensor(rows, dtype=torch.int64, device="cuda")
    # the first phase's input: the previous 'down' output (n_prev = HIDDEN) with its statistics
    bufs[0, :, :HIDDEN] = torch.randn(mt, HIDDEN, device="cuda")
    x0 = bufs[0, :, :HIDDEN].float()
    stats.zero_()
    stats[0, :mt, 0] = x0.pow(2).sum(1)
    stats[0, :mt, 1] = x0.abs().amax(1)

    def launch(p0: int, count: int, mode: int = 0) -> None:
        fn(
            grid=(sms, 1, 1),
            block=(NW * 32, 1, 1),
            args=[table[p0:], count, counter, p0, mode],
            shared_mem=smem,
        )

    # each phase kind against float32 torch from the kernel's own inputs
    worst = 1.0
    for p in range(len(order) + 1):
        name, n, k = order[p % len(order)]
        n_prev = order[(p - 1) % len(order)][1]
        wt, sc = w[name][p // len(order)]
        src, dst = bufs[p % 2].float(), bufs[(p + 1) % 2]
        sin = stats[p % 2].clone().view(sms, mt, 2)
        counter.fill_(p * sms)
        launch(p, 1)
        torch.cuda.synchronize()
        ss, am = (x0.pow(2).sum(1), x0.abs().amax(1)) if p == 0 else (sin[..., 0].sum(0), sin[..., 1].amax(0))
        inv = torch.rsqrt(ss / n_prev + 1e-6)
        xq = (src[:, :k] * (448.0 / am)[:, None]).to(torch.float8_e4m3fn).float()
        ref = (xq @ wt.float().t()) * sc[None, :] * (am * inv / 448.0)[:, None]
        got = dst[:, :n].float()
        cos = torch.nn.functional.cosine_similarity(got, ref, dim=1).min().item()
        rel = ((got - ref).abs().max() / ref.abs().max()).item()
        worst = min(worst, cos)
        print(
            f"M={mt} {xdt} {build} build phase {p} ({name}): min cosine {cos:.6f}, max error / max {rel:.2e}",
            flush=True,
        )
    nph = layers * len(order)
    gap_a = torch.randn(256 * 1024, device="cuda", dtype=torch.bfloat16)
    gap_b = torch.empty_like(gap_a)

    def one(mode: int) -> Callable[[], None]:
        def f() -> None:
            counter.zero_()
            launch(0, nph, mode)

        return f

    def per_layer() -> None:
        counter.zero_()
        for layer in range(layers):
            launch(layer * len(order), len(order))
            gap_b.copy_(gap_a)

    out = []
    for label, f in (
        ("one launch", one(0)),
        ("per layer + gap", per_layer),
        ("one launch, no mma", one(4)),
        ("one launch, no build", one(8)),
        ("one launch, no epilogue", one(16)),
        ("one launch, no build or epilogue", one(24)),
    ):
        t = time_graph(f, reps)
        out.append(
            {
                "variant": f"mma M={mt} {xdt} {build} build",
                "split": label,
                "tokens": mt,
                "inputs": xdt,
                "build": build,
                "smem_bytes": smem,
                "us_per_layer": t / layers * 1e6,
                "min_cosine": worst,
                "hung": bool(counter.item() & (1 << 30)),
            }
        )
    return out


if __name__ == "__main__":
    main()
