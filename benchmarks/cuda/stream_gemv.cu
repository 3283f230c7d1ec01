// Probe kernels (issue 13): persistent M = 1 FP8 GEMV chains whose weight stream does not stop at
// the grid barriers between GEMMs. Loaded by benchmarks/cuda_stream_probe.py; not used by the
// engine.
//
// One CTA per multiprocessor. Warp NCW (the producer) has one lane issue 4 KiB bulk copies
// (cp.async.bulk, sm90) of every weight row this CTA owns, phase after phase, into per-warp rings
// of DEPTH slots, gated only by the rings' "empty" mbarriers: weights do not depend on
// activations, so the copies of phase p + 1 run while the consumers wait at phase p's barrier.
// Warps 0 .. NCW - 1 (the consumers) wait at a grid barrier for phase p's input, load it into
// shared memory as fp16 (and its sum of squares), then take rows j = warp, warp + NCW, ... of
// this CTA's share: y[n] = inv_rms(x) * sum_k w[n, k] * x[k], w in e4m3 converted by
// cvt.rn.f16x2.e4m3x2, products summed 16 at a time in fp16x2 and across in fp32.
//
// Phase p reads x from buf[p % 2] (its first K floats) and writes y (N floats) to
// buf[(p + 1) % 2]. `counter` must be 0 at launch. A barrier not reached within 2^26 polls sets
// bit 30 of `counter` and every later barrier passes (the probe reports the hang).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#ifndef NCW
#define NCW 8
#endif
#ifndef DEPTH
#define DEPTH 4
#endif
#define SEG 4096
#define XMAX 12288
#define THREADS ((NCW + 1) * 32)
#define HANG (1u << 30)

struct PhaseDesc {
  unsigned long long w;  // e4m3 [n, k], row-major
  int n;
  int k;  // a multiple of SEG
};

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, unsigned bytes, uint64_t* bar,
                                         uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void named_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(NCW * 32) : "memory");
}
__device__ __forceinline__ __half2 e4m3x2(unsigned short v) {
  __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return *reinterpret_cast<__half2*>(&r);
}
// 16 weights (one uint4) against 16 fp16 x values (two uint4), summed in fp16x2.
__device__ __forceinline__ float dot16(uint4 w, uint4 xa, uint4 xb) {
  const __half2* a = reinterpret_cast<const __half2*>(&xa);
  const __half2* b = reinterpret_cast<const __half2*>(&xb);
  __half2 h = __hmul2(e4m3x2(w.x & 0xffff), a[0]);
  h = __hfma2(e4m3x2(w.x >> 16), a[1], h);
  h = __hfma2(e4m3x2(w.y & 0xffff), a[2], h);
  h = __hfma2(e4m3x2(w.y >> 16), a[3], h);
  h = __hfma2(e4m3x2(w.z & 0xffff), b[0], h);
  h = __hfma2(e4m3x2(w.z >> 16), b[1], h);
  h = __hfma2(e4m3x2(w.w & 0xffff), b[2], h);
  h = __hfma2(e4m3x2(w.w >> 16), b[3], h);
  float2 f = __half22float2(h);
  return f.x + f.y;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    stream_gemv(const PhaseDesc* __restrict__ phases, int num_phases, float* buf0, float* buf1,
                unsigned* counter, int evict_first, int mode) {
  // mode bits (timing only, results wrong): 2 no grid-barrier wait, 4 no dot products, 8 no x load
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;                                       // [NCW][DEPTH][SEG]
  __half* xs = reinterpret_cast<__half*>(smem + NCW * DEPTH * SEG);  // [XMAX], permuted per SEG
  uint64_t* full = reinterpret_cast<uint64_t*>(xs + XMAX);          // [NCW][DEPTH]
  uint64_t* empty = full + NCW * DEPTH;                              // [NCW][DEPTH]
  float* red = reinterpret_cast<float*>(empty + NCW * DEPTH);       // [NCW]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = gridDim.x, cta = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int i = 0; i < NCW * DEPTH; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  if (warp == NCW) {  // producer
    if (lane != 0) return;
    uint64_t policy;
    if (evict_first)
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    else
      asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
    unsigned it[NCW];
#pragma unroll
    for (int i = 0; i < NCW; ++i) it[i] = 0;
    for (int p = 0; p < num_phases; ++p) {
      const PhaseDesc d = phases[p];
      const long long r0 = (long long)d.n * cta / G, r1 = (long long)d.n * (cta + 1) / G;
      const unsigned char* w = reinterpret_cast<const unsigned char*>(d.w);
      const int segs = d.k / SEG;
      const int rows = (int)(r1 - r0);
      for (int j = 0; j < rows; ++j) {
        const int cw = j % NCW;
        for (int s = 0; s < segs; ++s) {
          unsigned n_it = 0;
#pragma unroll
          for (int i = 0; i < NCW; ++i)
            if (i == cw) n_it = it[i];
          const int st = n_it % DEPTH;
          const unsigned round = n_it / DEPTH;
          uint64_t* fb = &full[cw * DEPTH + st];
          if (round > 0) mbar_wait(&empty[cw * DEPTH + st], (round - 1) & 1);
          mbar_expect_tx(fb, SEG);
          bulk_g2s(ring + (cw * DEPTH + st) * SEG, w + (r0 + j) * d.k + (long long)s * SEG, SEG, fb,
                   policy);
#pragma unroll
          for (int i = 0; i < NCW; ++i)
            if (i == cw) it[i] = n_it + 1;
        }
      }
    }
    return;
  }

  // consumers
  unsigned it = 0;
  const int tid = threadIdx.x;  // 0 .. NCW * 32 - 1
  for (int p = 0; p < num_phases; ++p) {
    const PhaseDesc d = phases[p];
    const float* x = (p & 1) ? buf1 : buf0;
    float* y = (p & 1) ? buf0 : buf1;
    if (p > 0) {
      if (tid == 0 && !(mode & 2)) {
        const unsigned target = (unsigned)G * (unsigned)p;
        unsigned polls = 0;
        for (;;) {
          const unsigned v = ld_acquire(counter);
          if ((v & HANG) || (v & ~HANG) >= target) break;
          if (++polls == (1u << 26)) {
            atomicOr(counter, HANG);
            break;
          }
        }
      }
      named_sync();
    }
    // x -> shared fp16, permuted so that 16-byte unit u of a segment finds its 16 values at
    // halves [u * 8, u * 8 + 8) and [2048 + u * 8, 2048 + u * 8 + 8) of that segment.
    float ss = 0.f;
    for (int i = tid * 4; i < ((mode & 8) ? 0 : d.k); i += NCW * 32 * 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(x + i));
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      const int s = i / SEG, r = i % SEG, u = r / 16, within = r % 16;
      __half2* dst = reinterpret_cast<__half2*>(xs + s * SEG + (within / 8) * 2048 + u * 8 + within % 8);
      dst[0] = __floats2half2_rn(v.x, v.y);
      dst[1] = __floats2half2_rn(v.z, v.w);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    named_sync();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < NCW; ++i) tot += red[i];
    const float inv_rms = (mode & 8) ? 1.f : rsqrtf(tot / d.k + 1e-6f);

    const long long r0 = (long long)d.n * cta / G, r1 = (long long)d.n * (cta + 1) / G;
    const int segs = d.k / SEG;
    for (long long j = warp; j < r1 - r0; j += NCW) {
      float acc = 0.f;
      for (int s = 0; s < segs; ++s) {
        const int st = it % DEPTH;
        mbar_wait(&full[warp * DEPTH + st], (it / DEPTH) & 1);
        const uint4* wv = reinterpret_cast<const uint4*>(ring + (warp * DEPTH + st) * SEG);
        const uint4* xv = reinterpret_cast<const uint4*>(xs + s * SEG);
        if (!(mode & 4)) {
#pragma unroll
        for (int q = 0; q < SEG / 16 / 32; ++q) {
          const int u = lane + 32 * q;
          acc += dot16(wv[u], xv[u], xv[256 + u]);
        }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[warp * DEPTH + st]);
        ++it;
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      if (lane == 0) y[r0 + j] = acc * inv_rms;
    }
    named_sync();
    if (tid == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
    }
  }
}


// Second design: no producer, no rings. Each of NW warps loads its rows' 4 KiB segments straight
// into registers (8 x 16 B per lane) one segment ahead of the one it computes, across phase
// boundaries: the first segment of phase p + 1 is in flight while the warp waits at phase p's
// grid barrier. Same phases, buffers, barrier, modes and results as stream_gemv.
#ifndef NW
#define NW 16
#endif
struct Task {
  int p, j, s;
};
__device__ __forceinline__ bool next_task(Task& t, const PhaseDesc* phases, int num_phases, int cta,
                                          int G, int warp) {
  const PhaseDesc d = phases[t.p];
  if (t.s + 1 < d.k / SEG) {
    ++t.s;
    return true;
  }
  const int rows = (int)((long long)d.n * (cta + 1) / G - (long long)d.n * cta / G);
  t.s = 0;
  if (t.j + NW < rows) {
    t.j += NW;
    return true;
  }
  t.j = warp;
  return ++t.p < num_phases;
}
__device__ __forceinline__ void load_seg(uint4 (&r)[8], const PhaseDesc* phases, const Task& t,
                                         int cta, int G, int lane) {
  const PhaseDesc d = phases[t.p];
  const long long r0 = (long long)d.n * cta / G;
  const uint4* src = reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned char*>(d.w) +
                                                    (r0 + t.j) * d.k + (long long)t.s * SEG);
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(src + lane + 32 * q));
    r[q] = v;
  }
}
__device__ __forceinline__ void named_sync_nw() {
  asm volatile("bar.sync 1, %0;" ::"n"(NW * 32) : "memory");
}

extern "C" __global__ void __launch_bounds__(NW * 32, 1)
    ldg_gemv(const PhaseDesc* __restrict__ phases, int num_phases, float* buf0, float* buf1,
             unsigned* counter, int mode, int phase_base) {
  __shared__ __align__(16) __half xs[XMAX];
  __shared__ float red[NW];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int G = gridDim.x, cta = blockIdx.x;
  Task nt{0, warp, 0};
  bool have = true;
  uint4 nb[8];
  load_seg(nb, phases, nt, cta, G, lane);
  for (int p = 0; p < num_phases; ++p) {
    const PhaseDesc d = phases[p];
    const float* x = (p & 1) ? buf1 : buf0;
    float* y = (p & 1) ? buf0 : buf1;
    if (p > 0) {
      if (tid == 0 && !(mode & 2)) {
        const unsigned target = (unsigned)G * (unsigned)(phase_base + p);
        unsigned polls = 0;
        for (;;) {
          const unsigned v = ld_acquire(counter);
          if ((v & HANG) || (v & ~HANG) >= target) break;
          if (++polls == (1u << 26)) {
            atomicOr(counter, HANG);
            break;
          }
        }
      }
      named_sync_nw();
    }
    float ss = 0.f;
    for (int i = tid * 4; i < ((mode & 8) ? 0 : d.k); i += NW * 32 * 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(x + i));
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      const int s = i / SEG, r = i % SEG, u = r / 16, within = r % 16;
      __half2* dst = reinterpret_cast<__half2*>(xs + s * SEG + (within / 8) * 2048 + u * 8 + within % 8);
      dst[0] = __floats2half2_rn(v.x, v.y);
      dst[1] = __floats2half2_rn(v.z, v.w);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    named_sync_nw();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < NW; ++i) tot += red[i];
    const float inv_rms = (mode & 8) ? 1.f : rsqrtf(tot / d.k + 1e-6f);
    const long long r0 = (long long)d.n * cta / G;
    float acc = 0.f;
    while (have && nt.p == p) {
      uint4 cb[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) cb[q] = nb[q];
      const Task ct = nt;
      have = next_task(nt, phases, num_phases, cta, G, warp);
      if (have) load_seg(nb, phases, nt, cta, G, lane);
      const uint4* xv = reinterpret_cast<const uint4*>(xs + ct.s * SEG);
      if (!(mode & 4)) {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const int u = lane + 32 * q;
          acc += dot16(cb[q], xv[u], xv[256 + u]);
        }
      } else {
#pragma unroll
        for (int q = 0; q < 8; ++q) acc += __int_as_float(cb[q].x ^ cb[q].y ^ cb[q].z ^ cb[q].w) * 0.f;
      }
      if (ct.s + 1 == d.k / SEG) {
#pragma unroll
        for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) y[r0 + ct.j] = acc * inv_rms;
        acc = 0.f;
      }
    }
    named_sync_nw();
    if (tid == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
    }
  }
}

// Third design: as ldg_gemv, but each warp's lanes copy their own 16-byte units of the next
// DEPTH - 1 segments into a per-warp shared-memory ring with cp.async (each lane later reads
// only what it copied itself, so no cross-lane wait), so DEPTH - 1 segments per warp are in flight
// across each grid barrier instead of one.
#ifndef ADEPTH
#define ADEPTH 3
#endif
__device__ __forceinline__ void cp_async_seg(unsigned char* slot, const PhaseDesc* phases,
                                             const Task& t, int cta, int G, int lane) {
  const PhaseDesc d = phases[t.p];
  const long long r0 = (long long)d.n * cta / G;
  const unsigned char* src =
      reinterpret_cast<const unsigned char*>(d.w) + (r0 + t.j) * d.k + (long long)t.s * SEG;
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const int off = (lane + 32 * q) * 16;
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(smem_u32(slot + off)),
                 "l"(src + off)
                 : "memory");
  }
}

extern "C" __global__ void __launch_bounds__(NW * 32, 1)
    async_gemv(const PhaseDesc* __restrict__ phases, int num_phases, float* buf0, float* buf1,
               unsigned* counter, int mode, int phase_base) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;                                             // [NW][ADEPTH][SEG]
  __half* xs = reinterpret_cast<__half*>(smem + NW * ADEPTH * SEG);      // [XMAX]
  float* red = reinterpret_cast<float*>(xs + XMAX);                       // [NW]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int G = gridDim.x, cta = blockIdx.x;
  unsigned char* my = ring + warp * ADEPTH * SEG;
  // issue the first ADEPTH - 1 segments
  Task it{0, warp, 0};  // next task to issue
  bool more = true;
  int issued = 0;
#pragma unroll
  for (int i = 0; i < ADEPTH - 1; ++i) {
    if (more) {
      cp_async_seg(my + (issued % ADEPTH) * SEG, phases, it, cta, G, lane);
      more = next_task(it, phases, num_phases, cta, G, warp);
      ++issued;
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  Task ct{0, warp, 0};  // next task to compute
  int done = 0;
  for (int p = 0; p < num_phases; ++p) {
    const PhaseDesc d = phases[p];
    const float* x = (p & 1) ? buf1 : buf0;
    float* y = (p & 1) ? buf0 : buf1;
    if (p > 0) {
      if (tid == 0 && !(mode & 2)) {
        const unsigned target = (unsigned)G * (unsigned)(phase_base + p);
        unsigned polls = 0;
        for (;;) {
          const unsigned v = ld_acquire(counter);
          if ((v & HANG) || (v & ~HANG) >= target) break;
          if (++polls == (1u << 26)) {
            atomicOr(counter, HANG);
            break;
          }
        }
      }
      named_sync_nw();
    }
    float ss = 0.f;
    for (int i = tid * 4; i < ((mode & 8) ? 0 : d.k); i += NW * 32 * 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(x + i));
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      const int s = i / SEG, r = i % SEG, u = r / 16, within = r % 16;
      __half2* dst = reinterpret_cast<__half2*>(xs + s * SEG + (within / 8) * 2048 + u * 8 + within % 8);
      dst[0] = __floats2half2_rn(v.x, v.y);
      dst[1] = __floats2half2_rn(v.z, v.w);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    named_sync_nw();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < NW; ++i) tot += red[i];
    const float inv_rms = (mode & 8) ? 1.f : rsqrtf(tot / d.k + 1e-6f);
    const long long r0 = (long long)d.n * cta / G;
    float acc = 0.f;
    bool cmore = true;
    while (cmore && ct.p == p) {
      // issue one more segment (into the slot computed ADEPTH - 1 tasks ago), then wait for the
      // oldest of the ADEPTH outstanding groups
      if (more) {
        cp_async_seg(my + (issued % ADEPTH) * SEG, phases, it, cta, G, lane);
        more = next_task(it, phases, num_phases, cta, G, warp);
        ++issued;
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group %0;" ::"n"(ADEPTH - 1) : "memory");
      const uint4* wv = reinterpret_cast<const uint4*>(my + (done % ADEPTH) * SEG);
      const uint4* xv = reinterpret_cast<const uint4*>(xs + ct.s * SEG);
      if (!(mode & 4)) {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const int u = lane + 32 * q;
          acc += dot16(wv[u], xv[u], xv[256 + u]);
        }
      } else {
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const uint4 w = wv[lane + 32 * q];
          acc += __int_as_float(w.x ^ w.y ^ w.z ^ w.w) * 0.f;
        }
      }
      ++done;
      const Task fin = ct;
      cmore = next_task(ct, phases, num_phases, cta, G, warp);
      if (fin.s + 1 == d.k / SEG) {
#pragma unroll
        for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) y[r0 + fin.j] = acc * inv_rms;
        acc = 0.f;
      }
    }
    named_sync_nw();
    if (tid == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
}
