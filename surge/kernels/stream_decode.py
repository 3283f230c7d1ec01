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
Phase ``p`` gives block ``c`` rows ``[n c / G, n (c + 1) / G)``, and its warps take them round
robin, 4 KiB segments of a row at a time (``ld.global.nc``, 16 bytes per lane). Each block first
builds the phase's input ``x`` (all ``k`` values, in shared memory as fp16 with a power-of-two
scale that keeps ``|x| <= 16``, so eight fp16 products of an e4m3 weight (``|w| <= 448``) and an
input cannot overflow) according to its kind:

* :data:`KIND_INPUT`: ``x = input`` (bf16, e.g. the attention output);
* :data:`KIND_NORM`: ``x = rmsnorm(res_in) * norm_w`` (bf16 roundings as Hugging Face's
  ``Qwen3RMSNorm``); block 0 copies ``res_in`` to ``res_out`` if given (the embedding becomes
  the residual);
* :data:`KIND_ADD_NORM`: ``h = bf16(res_in + bf16(y_prev))``; block 0 stores ``h`` to ``res_out``;
  ``x = rmsnorm(h) * norm_w``;
* :data:`KIND_SILU`: ``x = bf16(bf16(silu(bf16(g))) * bf16(u))`` with ``g, u = y_prev[:k],
  y_prev[k:2k]`` (SwiGLU over a merged gate_up output).

Rows are dot products of 16 weights at a time (``cvt.rn.f16x2.e4m3x2``, ``fma.rn.f16x2``), summed
in float32; ``y[row] = acc * w_scale[row] * 2^e`` is stored as float32 or bf16. Results match
:func:`stream_reference` to fp16 rounding (the tests' bound), not bit for bit with the Triton path.

The kernel is compiled at first use with NVRTC through ``torch.cuda._compile_kernel`` (no
headers; sm89+ for the e4m3 conversion). Sources: the PTX ISA (``cvt``, ``fma.rn.f16x2``,
``ld.acquire``, ``bar.sync``); the grid barrier is the usual arrive-counter (release add, acquire
poll) of cooperative groups; the persistent layout follows the "megakernel" idea of Hazy
Research's low-latency Llama decode (2025), written here for Surge's FP8 weights.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass
from typing import Any

import torch

from surge.quant.fp8 import quantize_per_channel

KIND_INPUT = 0
KIND_NORM = 1
KIND_ADD_NORM = 2
KIND_SILU = 3

_WARPS = 16
_SEG = 4096
XMAX = 16384
"""Largest ``k`` a phase may have (fp16 inputs in shared memory)."""
_SMEM = 10 * XMAX  # dynamic shared memory: fp16 inputs, their float32 staging, norm weights (bytes)
_FIELDS = 10
_HANG = 1 << 30

_SOURCE = r"""
#define NW 16
#define SEG 4096
#define XMAX 16384
#define THREADS (NW * 32)
#define HANG (1u << 30)
#define MAX_POLLS (1u << 26)

typedef unsigned long long u64;
struct __align__(16) U4 { unsigned x, y, z, w; };
struct Phase {
  u64 w, w_scale, x, res_in, res_out, norm_w, y;
  int n, k, kind, y_bf16;
  float eps, pad;
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
__device__ __forceinline__ float bf16r(float x) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return __uint_as_float(((unsigned)h) << 16);
}
__device__ __forceinline__ unsigned short to_bf16(float x) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
__device__ __forceinline__ void bf16x4(const unsigned short* p, float* v) {
  unsigned a, b;
  asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p));
  v[0] = __uint_as_float(a << 16);
  v[1] = __uint_as_float(a & 0xffff0000u);
  v[2] = __uint_as_float(b << 16);
  v[3] = __uint_as_float(b & 0xffff0000u);
}
__device__ __forceinline__ void f32x4(const float* p, float* v) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(p));
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void block_sync() { asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory"); }
// Block cta's first row of phase d: n * cta / G in 32 bits (n * G < 2^32 for any model).
__device__ __forceinline__ int row0_of(const Phase& d, int cta, int G) {
  return (int)((unsigned)d.n * (unsigned)cta / (unsigned)G);
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
  if ((t.s + 1) * SEG < ph[t.p].k) {
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
  const long long row = row0_of(d, cta, G) + t.j;
  scale = __ldg(reinterpret_cast<const float*>(d.w_scale) + row);
  const unsigned char* src = reinterpret_cast<const unsigned char*>(d.w) + row * d.k + (long long)t.s * SEG;
  const int bytes = min(SEG, d.k - t.s * SEG);
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

// Value i .. i + 3 of phase d's pre-norm input: the input, silu(g) * u, or the (new) residual h.
__device__ __forceinline__ void input4(const Phase& d, const unsigned short* xin, const unsigned short* res,
                                       int i, float* v) {
  const int kind = d.kind;
  const float* yp = reinterpret_cast<const float*>(d.x);
  if (kind == 0) {
    bf16x4(xin + i, v);
  } else if (kind == 3) {
    float g[4], u[4];
    f32x4(yp + i, g);
    f32x4(yp + d.k + i, u);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float gb = bf16r(g[c]);
      const float a = bf16r(gb / (1.f + __expf(-gb)));
      v[c] = bf16r(a * bf16r(u[c]));
    }
  } else {
    bf16x4(res + i, v);
    if (kind == 2) {
      float y[4];
      f32x4(yp + i, y);
#pragma unroll
      for (int c = 0; c < 4; ++c) v[c] = bf16r(v[c] + bf16r(y[c]));
    }
  }
}

// Builds phase d's input in xs (fp16, scaled by 2^-e, permuted so that 16-byte unit u of a
// segment finds its values at halves [u * 8, u * 8 + 8) and [2048 + u * 8, ...)); returns 2^e.
// The first pass stages the pre-norm values in xf and the norm weights in wf (float32, shared
// memory), so that registers stay free for the weights in flight and the second pass does not go
// back to L2.
__device__ float build_x(const Phase& d, const void* x_override, unsigned short* xs, float* xf, float* wf,
                         float* red, int cta, int tid, int warp, int lane) {
  const int k = d.k;
  const int kind = d.kind;
  const bool norm = kind == 1 || kind == 2;
  const unsigned short* xin = reinterpret_cast<const unsigned short*>(x_override ? x_override : (const void*)d.x);
  const unsigned short* res = reinterpret_cast<const unsigned short*>(
      (x_override && kind == 1) ? x_override : (const void*)d.res_in);
  const unsigned short* nw = reinterpret_cast<const unsigned short*>(d.norm_w);
  unsigned short* rout = reinterpret_cast<unsigned short*>(d.res_out);
  float ss = 0.f, am = 0.f;
  for (int i = tid * 4; i < k; i += THREADS * 4) {
    float v[4];
    input4(d, xin, res, i, v);
    *reinterpret_cast<float4*>(xf + i) = make_float4(v[0], v[1], v[2], v[3]);
    if (norm) {
      float w[4];
      bf16x4(nw + i, w);
      *reinterpret_cast<float4*>(wf + i) = make_float4(w[0], w[1], w[2], w[3]);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        ss += v[c] * v[c];
        am = fmaxf(am, fabsf(v[c] * w[c]));
      }
      if (cta == 0 && (kind == 2 || rout != nullptr)) {
        const unsigned a = (unsigned)to_bf16(v[0]) | ((unsigned)to_bf16(v[1]) << 16);
        const unsigned b = (unsigned)to_bf16(v[2]) | ((unsigned)to_bf16(v[3]) << 16);
        asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(rout + i), "r"(a), "r"(b) : "memory");
      }
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) am = fmaxf(am, fabsf(v[c]));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    ss += __shfl_xor_sync(0xffffffffu, ss, o);
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
  }
  if (lane == 0) {
    red[warp] = ss;
    red[NW + warp] = am;
  }
  block_sync();
  float tot = 0.f, amax = 0.f;
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    tot += red[i];
    amax = fmaxf(amax, red[NW + i]);
  }
  const float inv = norm ? rsqrtf(tot / (float)k + d.eps) : 1.f;
  const float bound = amax * inv * 1.0001f;
  int e = 0;
  if (bound > 0.f) e = max(-40, min(40, (int)ceilf(log2f(bound * 0.0625f))));
  const float down = exp2f((float)-e);
  for (int i = tid * 4; i < k; i += THREADS * 4) {
    const float4 f = *reinterpret_cast<const float4*>(xf + i);
    float x[4] = {f.x, f.y, f.z, f.w};
    if (norm) {
      const float4 w = *reinterpret_cast<const float4*>(wf + i);
      x[0] = bf16r(w.x * bf16r(x[0] * inv)) * down;
      x[1] = bf16r(w.y * bf16r(x[1] * inv)) * down;
      x[2] = bf16r(w.z * bf16r(x[2] * inv)) * down;
      x[3] = bf16r(w.w * bf16r(x[3] * inv)) * down;
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c) x[c] *= down;
    }
    const int s = i / SEG, r = i % SEG, u = r / 16, within = r % 16;
    unsigned* dst = reinterpret_cast<unsigned*>(xs + s * SEG + (within / 8) * 2048 + u * 8 + within % 8);
    dst[0] = pack_h2(x[0], x[1]);
    dst[1] = pack_h2(x[2], x[3]);
  }
  return exp2f((float)e);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
stream_decode(const Phase* __restrict__ phases, int num_phases, unsigned* counter, int phase_base,
              const unsigned short* x0, int use_x0) {
  extern __shared__ __align__(16) unsigned char dyn[];
  unsigned short* xs = reinterpret_cast<unsigned short*>(dyn);       // [XMAX] fp16, permuted
  float* xf = reinterpret_cast<float*>(dyn + 2 * XMAX);              // [XMAX] float32 staging
  float* wf = reinterpret_cast<float*>(dyn + 6 * XMAX);              // [XMAX] norm weights
  __shared__ float red[2 * NW];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  const int G = gridDim.x, cta = blockIdx.x;
  Task nt{0, warp, 0};
  bool have = seek(nt, phases, num_phases, cta, G, warp);
  U4 nb[8];
  float nsc = 0.f;
  if (have) load_seg(nb, nsc, phases, nt, cta, G, lane);
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
    const float up = build_x(d, (p == 0 && use_x0) ? (const void*)x0 : nullptr, xs, xf, wf, red, cta, tid, warp, lane);
    block_sync();
    const int r0 = row0_of(d, cta, G);
    const int k = d.k;
    const bool y_bf16 = d.y_bf16 != 0;
    void* const yp = reinterpret_cast<void*>(d.y);
    float acc = 0.f;
    while (have && nt.p == p) {
      U4 cb[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) cb[q] = nb[q];
      const Task ct = nt;
      const float csc = nsc;
      have = next_task(nt, phases, num_phases, cta, G, warp);
      if (have) load_seg(nb, nsc, phases, nt, cta, G, lane);
      const U4* xv = reinterpret_cast<const U4*>(xs + ct.s * SEG);
      const int bytes = min(SEG, k - ct.s * SEG);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int u = lane + 32 * q;
        if (u * 16 < bytes) acc += dot16(cb[q], xv[u], xv[256 + u]);
      }
      if ((ct.s + 1) * SEG >= k) {
#pragma unroll
        for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) {
          const float out = acc * csc * up;
          if (y_bf16)
            reinterpret_cast<unsigned short*>(yp)[r0 + ct.j] = to_bf16(out);
          else
            reinterpret_cast<float*>(yp)[r0 + ct.j] = out;
        }
        acc = 0.f;
      }
    }
    block_sync();
    if (tid == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
    }
  }
}
"""


@dataclass(frozen=True)
class StreamPhase:
    """One GEMV of a :func:`stream_decode` launch (tensors on the launch's device).

    Attributes:
        weight: float8_e4m3fn ``[n, k]`` contiguous; ``k`` a multiple of 16, at most
            :data:`XMAX`.
        weight_scale: float32 ``[n]``, one scale per row.
        kind: :data:`KIND_INPUT`, :data:`KIND_NORM`, :data:`KIND_ADD_NORM` or :data:`KIND_SILU`.
        x: the input: bf16 ``[k]`` (``KIND_INPUT``), the previous phase's float32 output
            (``KIND_ADD_NORM``: ``[k]``; ``KIND_SILU``: ``[2k]``), unused otherwise.
        res_in: bf16 ``[k]`` residual (``KIND_NORM``, ``KIND_ADD_NORM``).
        res_out: bf16 ``[k]``, where ``KIND_ADD_NORM`` stores the new residual (``KIND_NORM``:
            a copy of its input, if given).
        norm_w: bf16 ``[k]`` RMSNorm weight (``KIND_NORM``, ``KIND_ADD_NORM``).
        eps: RMSNorm epsilon.
        y: the output, float32 or bf16 ``[n]``.
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor
    kind: int
    y: torch.Tensor
    x: torch.Tensor | None = None
    res_in: torch.Tensor | None = None
    res_out: torch.Tensor | None = None
    norm_w: torch.Tensor | None = None
    eps: float = 1e-6

    @property
    def n(self) -> int:
        """Output rows."""
        return int(self.weight.shape[0])

    @property
    def k(self) -> int:
        """Input length."""
        return int(self.weight.shape[1])


def check_phase(ph: StreamPhase) -> None:
    """Raises ``ValueError`` unless ``ph`` has the shapes, dtypes and tensors its kind needs."""
    n, k = ph.n, ph.k
    if ph.weight.dtype != torch.float8_e4m3fn or not ph.weight.is_contiguous():
        raise ValueError("stream phase weight must be contiguous float8_e4m3fn [n, k]")
    if k % 16 or k > XMAX:
        raise ValueError(f"stream phase k={k} must be a multiple of 16 and at most {XMAX}")
    if ph.weight_scale.dtype != torch.float32 or ph.weight_scale.numel() != n:
        raise ValueError("stream phase weight_scale must be float32 [n]")
    if ph.y.numel() != n or ph.y.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError("stream phase y must be float32 or bf16 [n]")
    need: dict[int, tuple[str, ...]] = {
        KIND_INPUT: ("x",),
        KIND_NORM: ("res_in", "norm_w"),
        KIND_ADD_NORM: ("x", "res_in", "res_out", "norm_w"),
        KIND_SILU: ("x",),
    }
    if ph.kind not in need:
        raise ValueError(f"unknown stream phase kind {ph.kind}")
    for name in need[ph.kind]:
        if getattr(ph, name) is None:
            raise ValueError(f"stream phase of kind {ph.kind} needs {name}")
    # (tensor, dtype, least numel) of what this kind reads and writes besides weight and y
    x_dtype = torch.bfloat16 if ph.kind == KIND_INPUT else torch.float32
    x_len = 2 * k if ph.kind == KIND_SILU else k
    operands = {"x": (x_dtype, x_len), "res_in": (torch.bfloat16, k), "res_out": (torch.bfloat16, k)}
    operands["norm_w"] = (torch.bfloat16, k)
    for name, (dtype, numel) in operands.items():
        t = getattr(ph, name)
        if t is None or (name == "x" and ph.kind == KIND_NORM):
            continue
        if t.dtype != dtype or t.numel() < numel or not t.is_contiguous() or t.device != ph.weight.device:
            raise ValueError(
                f"stream phase of kind {ph.kind}: {name} must be a contiguous {dtype} tensor of at least "
                f"{numel} values on {ph.weight.device}"
            )


def pack_phases(phases: list[StreamPhase]) -> torch.Tensor:
    """The launch table: int64 ``[len(phases), 10]`` on the phases' device, one row per phase
    laid out as the kernel's ``Phase`` struct (seven pointers; ``n | k << 32``;
    ``kind | y_bf16 << 32``; ``eps`` as float32 bits). Raises ``ValueError`` on a bad phase."""
    rows = []
    for ph in phases:
        check_phase(ph)

        def ptr(t: torch.Tensor | None) -> int:
            return 0 if t is None else int(t.data_ptr())

        eps_bits = struct.unpack("<I", struct.pack("<f", ph.eps))[0]
        rows.append(
            [
                ptr(ph.weight),
                ptr(ph.weight_scale),
                ptr(ph.x),
                ptr(ph.res_in),
                ptr(ph.res_out),
                ptr(ph.norm_w),
                ptr(ph.y),
                ph.n | (ph.k << 32),
                ph.kind | (int(ph.y.dtype == torch.bfloat16) << 32),
                eps_bits,
            ]
        )
    return torch.tensor(rows, dtype=torch.int64).to(phases[0].weight.device)


def stream_input(ph: StreamPhase, x0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Phase ``ph``'s input as the kernel builds it, in float32 before its fp16 rounding
    (``[k]``), and what it stores to ``res_out`` (bf16 ``[k]``; None without ``res_out``).
    ``x0`` replaces ``x`` (``KIND_INPUT``) or ``res_in`` (``KIND_NORM``), as the launch's
    ``x0`` argument does for its first phase."""
    k, bf = ph.k, torch.bfloat16
    if ph.kind == KIND_INPUT:
        src = x0 if x0 is not None else ph.x
        assert src is not None
        return src.reshape(-1)[:k].float(), None
    if ph.kind == KIND_SILU:
        assert ph.x is not None
        g = ph.x.reshape(-1)[:k].float().to(bf).float()
        u = ph.x.reshape(-1)[k : 2 * k].float().to(bf).float()
        a = (g / (1 + torch.exp(-g))).to(bf).float()
        return (a * u).to(bf).float(), None
    assert ph.norm_w is not None
    res_src = x0 if (x0 is not None and ph.kind == KIND_NORM) else ph.res_in
    assert res_src is not None
    h = res_src.reshape(-1)[:k].float()
    if ph.kind == KIND_ADD_NORM:
        assert ph.x is not None
        h = (h + ph.x.reshape(-1)[:k].float().to(bf).float()).to(bf).float()
    new_res = h.to(bf) if ph.res_out is not None else None
    inv = torch.rsqrt(h.pow(2).mean() + ph.eps)
    return (ph.norm_w.float() * (h * inv).to(bf).float()).to(bf).float(), new_res


def stream_reference(phases: list[StreamPhase], x0: torch.Tensor | None = None) -> None:
    """What :func:`stream_decode` computes, in torch (the tests' reference and the CPU path):
    runs the phases in order, writing each ``y`` (and ``res_out``) in place. The input is
    rounded to fp16 after the same power-of-two scaling as the kernel's; products are summed
    in float32 (the kernel sums eight at a time in fp16)."""
    for i, ph in enumerate(phases):
        x, new_res = stream_input(ph, x0 if i == 0 else None)
        bound = float(x.abs().max()) * 1.0001
        e = 0 if bound == 0 else max(-40, min(40, math.ceil(math.log2(bound / 16))))
        xh = (x * 2.0**-e).half().float()
        acc = ph.weight.float() @ xh
        out = acc * ph.weight_scale.float() * 2.0**e
        ph.y.reshape(-1).copy_(out.to(ph.y.dtype))
        if new_res is not None:
            assert ph.res_out is not None
            ph.res_out.reshape(-1).copy_(new_res)


@dataclass
class StreamDecodeKernel:
    """The compiled kernel of one device and its launch state.

    Attributes:
        device: the CUDA device.
        counter: int32 ``[1]``, the grid barrier's arrivals; zero it once per step
            (:meth:`reset`) and pass each launch its first phase's index in the step.
        num_sms: blocks per launch (one per multiprocessor).
    """

    device: torch.device
    counter: torch.Tensor
    num_sms: int
    _fn: Any = dataclasses.field(repr=False, default=None)

    @classmethod
    def compile(cls, device: torch.device) -> StreamDecodeKernel:
        """NVRTC-compiles the kernel for ``device`` and runs :meth:`self_test`. Raises
        ``RuntimeError`` where it cannot (no NVRTC, a GPU older than sm89 or with less than
        160 KiB of shared memory per block (Hopper has 227; Ada's 99 is too little), a compile
        error, a failed self-test)."""
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise RuntimeError(f"stream decode needs sm89+ (e4m3 conversion), not sm{major}{minor}")
        compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
        if compile_kernel is None:
            raise RuntimeError("this torch has no torch.cuda._compile_kernel (NVRTC)")
        props = torch.cuda.get_device_properties(device)
        optin = getattr(props, "shared_memory_per_block_optin", None)  # (set_shared_memory_config checks too)
        if optin is not None and int(optin) < _SMEM:
            raise RuntimeError(
                f"stream decode needs {_SMEM // 1024} KiB of shared memory per block, this GPU has {optin // 1024}"
            )
        with torch.cuda.device(device):
            fn = compile_kernel(_SOURCE, "stream_decode")
            if not hasattr(fn, "set_shared_memory_config"):
                raise RuntimeError("this torch's compiled kernels cannot be given 160 KiB of shared memory")
            fn.set_shared_memory_config(_SMEM)
        counter = torch.zeros(1, dtype=torch.int32, device=device)
        kernel = cls(device=device, counter=counter, num_sms=props.multi_processor_count, _fn=fn)
        kernel.self_test()
        return kernel

    def self_test(self) -> None:
        """Run two small phases (a norm and a SwiGLU, with a grid barrier between them) and compare
        them with :func:`stream_reference`. Raises ``RuntimeError`` when a barrier timed out (the
        blocks are not all resident at once: another kernel or an SM limit such as MPS holds
        some multiprocessors) or the results differ; called by :meth:`compile`."""
        dev, bf = self.device, torch.bfloat16
        g = torch.Generator(device="cpu").manual_seed(0)
        k, n = 512, 4 * self.num_sms + 3

        def weight(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
            q, s = quantize_per_channel(torch.randn(rows, cols, generator=g) * cols**-0.5)
            return q.to(dev), s.to(dev)

        res = torch.randn(k, generator=g).to(bf).to(dev)
        norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(bf).to(dev)
        gu = torch.full((2 * k,), float("nan"), device=dev)
        out = torch.full((n,), float("nan"), device=dev)
        phases = [
            StreamPhase(*weight(2 * k, k), KIND_NORM, gu, res_in=res, norm_w=norm_w),
            StreamPhase(*weight(n, k), KIND_SILU, out, x=gu),
        ]
        self.reset()
        self.launch(pack_phases(phases), 0)
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
        """Zero the barrier counter (once per step, before its first launch)."""
        self.counter.zero_()

    def hung(self) -> bool:
        """Whether a barrier timed out since the last :meth:`reset` (blocks not co-resident);
        synchronizes."""
        return bool(int(self.counter.item()) & _HANG)

    def launch(self, table: torch.Tensor, phase_base: int, x0: torch.Tensor | None = None) -> None:
        """Run the phases of ``table`` (rows of :func:`pack_phases`) on the current stream.

        Args:
            table: int64 ``[P, 10]``, a contiguous slice of a packed table.
            phase_base: how many phases of this step ran before (the counter's offset).
            x0: overrides the first phase's ``x`` (``KIND_INPUT``) or ``res_in``
                (``KIND_NORM``); bf16, contiguous.
        """
        args = [table, int(table.shape[0]), self.counter, phase_base]
        args += [x0 if x0 is not None else table, int(x0 is not None)]
        self._fn(grid=(self.num_sms, 1, 1), block=(_WARPS * 32, 1, 1), args=args, shared_mem=_SMEM)
