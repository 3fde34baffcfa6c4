// The one-shot all-reduce's kernel (p2p_reduce.h says what it computes and why the calls can be
// replayed from a graph). Hand-written, see there.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/p2p_reduce.h"

namespace ingot::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Call numbers wrap at 2^32 (hours of decoding at 100 calls a step); a flag has reached call c when it
// is no more than 2^31 calls behind, compared as serial numbers.
__device__ __forceinline__ bool reached(uint32_t flag, uint32_t c) { return int32_t(flag - c) >= 0; }

// Elements [lo, hi) of this block's slice, as 16-byte vectors where the buffer allows (vec_end) and
// single elements after.
template <typename T>
struct Slice {
  int64_t lo, vec_end, hi;
};

template <typename T>
__device__ __forceinline__ Slice<T> block_slice(const P2pReduceParams& p) {
  constexpr int64_t V = 16 / sizeof(T);
  const int64_t vectors = (p.count + V - 1) / V;
  const int64_t per = (vectors + gridDim.x - 1) / gridDim.x * V;  // elements, whole vectors
  Slice<T> s;
  s.lo = min(p.count, int64_t(blockIdx.x) * per);
  s.hi = min(p.count, s.lo + per);
  const bool aligned = reinterpret_cast<uintptr_t>(p.buf) % 16 == 0;
  s.vec_end = aligned ? s.lo + (s.hi - s.lo) / V * V : s.lo;
  return s;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) p2p_reduce_kernel(const P2pReduceParams p) {
  constexpr int V = 16 / sizeof(T);
  pdl_wait();  // the addend is the previous kernel's output
  const int b = blockIdx.x;
  const uint32_t call = p.calls[b] + 1;
  const int slot = call & 1;
  const Slice<T> s = block_slice<T>(p);
  T* buf = static_cast<T*>(p.buf);

  // 1. This rank's slice into its place in every rank's slot (this rank's own included, so the sum
  //    below reads every addend from the same local memory, in the same way on every rank).
  const size_t place = (size_t(slot) * size_t(p.world) + size_t(p.rank)) * size_t(p.slot_bytes);
  for (int q = 0; q < p.world; ++q) {
    T* dst = reinterpret_cast<T*>(p.staging[q] + place);
    for (int64_t i = s.lo + int64_t(threadIdx.x) * V; i < s.vec_end; i += int64_t(kThreads) * V)
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(buf + i);
    for (int64_t i = s.vec_end + threadIdx.x; i < s.hi; i += kThreads) dst[i] = buf[i];
  }
  // 2. Each thread's writes made visible system-wide (fence), the block's all done (barrier), then its
  //    flag on every rank, released at system scope, so a rank that sees the flag sees the slice.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x < p.world) store_release_sys(p.flags[threadIdx.x] + size_t(b) * p.world + p.rank, call);
  // 3. Every rank's block b has delivered here.
  if (threadIdx.x < p.world) {
    const uint32_t* f = p.flags[p.rank] + size_t(b) * p.world + threadIdx.x;
    const uint64_t start = global_ns();
    uint64_t looked = start;
    while (!reached(load_acquire_sys(f), call)) {
      const uint64_t now = global_ns();
      // The host's word that a peer is dead, read once a millisecond (it is across PCIe).
      if (p.host_words && now - looked > 1000000) {
        looked = now;
        if (reinterpret_cast<volatile const int*>(p.host_words)[1]) __trap();
      }
      if (p.timeout_ns && now - start > p.timeout_ns) {
        // A peer alive but not calling (or gone without its process group noticing): stop with an
        // error the host can name instead of hanging the stream.
        if (p.host_words) *reinterpret_cast<volatile int*>(p.host_words) = 1 + int(threadIdx.x);
        __threadfence_system();
        __trap();
      }
    }
  }
  __syncthreads();
  // 4. The sum, rank 0 first, in f32, rounded once. The slices are read past L1 (ld.cg): L1 is not
  //    kept coherent with the peers' writes, and the same slot addresses come back every other call.
  const uint8_t* mine = p.staging[p.rank] + size_t(slot) * size_t(p.world) * size_t(p.slot_bytes);
  for (int64_t i = s.lo + int64_t(threadIdx.x) * V; i < s.vec_end; i += int64_t(kThreads) * V) {
    float acc[V];
    for (int r = 0; r < p.world; ++r) {
      const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(reinterpret_cast<const T*>(mine + size_t(r) * p.slot_bytes) + i));
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = r == 0 ? to_f(v[k]) : acc[k] + to_f(v[k]);
    }
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < V; ++k) o[k] = from_f<T>(acc[k]);
    *reinterpret_cast<uint4*>(buf + i) = out;
  }
  for (int64_t i = s.vec_end + threadIdx.x; i < s.hi; i += kThreads) {
    float acc = 0.f;
    for (int r = 0; r < p.world; ++r) {
      const float v = to_f(__ldcg(reinterpret_cast<const T*>(mine + size_t(r) * p.slot_bytes) + i));
      acc = r == 0 ? v : acc + v;
    }
    buf[i] = from_f<T>(acc);
  }
  // The call is this block's from now on (read by this block only, at its next call).
  if (threadIdx.x == 0) p.calls[b] = call;
}

}  // namespace

void p2p_reduce_sum(const P2pReduceParams& p, DType dtype, cudaStream_t s) {
  if (p.world < 2 || p.world > kP2pMaxRanks || p.rank < 0 || p.rank >= p.world)
    throw Error("p2p all-reduce: rank " + std::to_string(p.rank) + " of " + std::to_string(p.world) +
                " is outside the 2.." + std::to_string(kP2pMaxRanks) + " ranks it serves");
  if (p.count < 0 || uint64_t(p.count) * dtype_size(dtype) > uint64_t(p.slot_bytes))
    throw Error("p2p all-reduce: " + std::to_string(p.count) + " elements of " + std::string(dtype_name(dtype)) +
                " do not fit its slot of " + std::to_string(p.slot_bytes) + " bytes");
  if (p.slot_bytes % 16 != 0) throw Error("p2p all-reduce: slot_bytes must be a multiple of 16");
  // An empty call still runs: every rank's blocks count every call, so all ranks must launch alike.
  dispatch(dtype, "p2p all-reduce", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("p2p_reduce_kernel", p2p_reduce_kernel<T>, dim3(kP2pBlocks), dim3(kThreads), 0, s, p);
  });
}

}  // namespace ingot::cuda
