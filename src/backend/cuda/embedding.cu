// Embedding gather on the GPU: out[t, :] = table[ids[t], :], one block per token. The table is in the
// activation dtype, or 16-bit under f32 activations (widened exactly).
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"

namespace ingot::cuda {
namespace {

struct EmbeddingArgs {
  const void* table;
  int64_t table_ld, vocab;
  const int32_t* ids;
  void* out;
  int64_t out_ld, cols;
};

// Tt: the table's element type; To: the output's (Tt, or f32 beside a 16-bit table).
template <typename Tt, typename To>
__global__ void embedding_kernel(EmbeddingArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int32_t id = a.ids[t];
  To* o = static_cast<To*>(a.out) + t * a.out_ld;
  // The Model validates ids before any compute; an id outside the table still never reads out of
  // bounds here, and gives a NaN row so the damage is visible rather than silent.
  if (id < 0 || id >= a.vocab) {
    for (int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) o[i] = from_f<To>(__int_as_float(0x7fc00000));
    return;
  }
  const Tt* r = static_cast<const Tt*>(a.table) + int64_t(id) * a.table_ld;
  if constexpr (std::is_same_v<Tt, To>) {
    for (int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) o[i] = r[i];
  } else {
    for (int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) o[i] = from_f<To>(to_f(r[i]));
  }
}

}  // namespace

void launch_embedding(const Mat& table, const int32_t* ids, const Mat& out, cudaStream_t s) {
  const bool widen = widened_weights(out.dtype, table.dtype);
  if (table.dtype != out.dtype && !widen)
    throw Error("cuda backend: embedding table is " + std::string(dtype_name(table.dtype)) + " but activations are " +
                std::string(dtype_name(out.dtype)) + "; build the engine in the backend's dtype");
  if (out.rows == 0) return;
  EmbeddingArgs a{table.data, table.ld, table.rows, ids, out.data, out.ld, out.cols};
  dispatch(table.dtype, "embedding", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (widen)
      launch("embedding_kernel", embedding_kernel<T, float>, dim3(unsigned(out.rows)), dim3(256), 0, s, a);
    else
      launch("embedding_kernel", embedding_kernel<T, T>, dim3(unsigned(out.rows)), dim3(256), 0, s, a);
  });
}

}  // namespace ingot::cuda
