// Embedding gather on the GPU: out[t, :] = table[ids[t], :], one block per token.
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

template <typename T>
__global__ void embedding_kernel(EmbeddingArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int32_t id = a.ids[t];
  T* o = static_cast<T*>(a.out) + t * a.out_ld;
  // The Model validates ids before any compute; an id outside the table still never reads out of
  // bounds here, and gives a NaN row so the damage is visible rather than silent.
  if (id < 0 || id >= a.vocab) {
    for (int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) o[i] = from_f<T>(__int_as_float(0x7fc00000));
    return;
  }
  const T* r = static_cast<const T*>(a.table) + int64_t(id) * a.table_ld;
  for (int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) o[i] = r[i];
}

}  // namespace

void launch_embedding(const Mat& table, const int32_t* ids, const Mat& out, cudaStream_t s) {
  if (table.dtype != out.dtype)
    throw Error("cuda backend: embedding table is " + std::string(dtype_name(table.dtype)) + " but activations are " +
                std::string(dtype_name(out.dtype)) + "; build the engine in the backend's dtype");
  if (out.rows == 0) return;
  EmbeddingArgs a{table.data, table.ld, table.rows, ids, out.data, out.ld, out.cols};
  dispatch(out.dtype, "embedding", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch("embedding_kernel", embedding_kernel<T>, dim3(unsigned(out.rows)), dim3(256), 0, s, a);
  });
}

}  // namespace ingot::cuda
