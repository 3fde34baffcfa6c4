// A Backend that passes every call to another one it owns: the base of wrappers that watch, count or
// answer for a few calls (the activation-aware quantizer's recorder of linear inputs, tests'
// allocation counters) and override only those. Written out once so that a new Backend method is
// forwarded in one place.
#pragma once
#include <memory>
#include <utility>

#include "backend/backend.h"

namespace ingot {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : in_(std::move(inner)) {}

  std::string name() const override { return in_->name(); }
  DType activation_dtype() const override { return in_->activation_dtype(); }
  bool host_memory() const override { return in_->host_memory(); }
  bool int4_weights() const override { return in_->int4_weights(); }
  bool int4_scales(DType scale_dtype) const override { return in_->int4_scales(scale_dtype); }
  size_t linear_scratch_bytes(DType wdt, int64_t rows, int64_t cols, int64_t tokens, bool perm) const override {
    return in_->linear_scratch_bytes(wdt, rows, cols, tokens, perm);
  }
  void reserve_linear_scratch(size_t bytes) override { in_->reserve_linear_scratch(bytes); }
  void relayout_int4(Mat& w) override { in_->relayout_int4(w); }

  void* alloc(size_t b) override { return in_->alloc(b); }
  void free(void* p) noexcept override { in_->free(p); }
  void upload(void* d, const void* s, size_t b) override { in_->upload(d, s, b); }
  void download(void* d, const void* s, size_t b) override { in_->download(d, s, b); }
  void fill_zero(void* d, size_t b) override { in_->fill_zero(d, b); }
  void synchronize() override { in_->synchronize(); }
  std::unique_ptr<Readback> make_readback(size_t max_bytes) override { return in_->make_readback(max_bytes); }
  std::unique_ptr<Graph> capture(const std::function<void()>& body) override { return in_->capture(body); }
  double copy_bandwidth_gbs() override { return in_->copy_bandwidth_gbs(); }
  size_t peak_memory_bytes() const override { return in_->peak_memory_bytes(); }
  std::optional<size_t> available_memory_bytes() const override { return in_->available_memory_bytes(); }

  void embedding(const Mat& t, const int32_t* ids, const Mat& o) override { in_->embedding(t, ids, o); }
  void add_rmsnorm(const Mat& x, const Mat* d, const void* w, DType wd, float eps, const Mat& o) override {
    in_->add_rmsnorm(x, d, w, wd, eps, o);
  }
  void linear(const Mat& x, const Mat& w, const void* bias, const Mat& y) override { in_->linear(x, w, bias, y); }
  void rope_cache_write(const RopeWriteParams& p) override { in_->rope_cache_write(p); }
  void attention(const AttentionParams& p) override { in_->attention(p); }
  void sigmoid_gate(const Mat& x, const Mat& g, const Mat& o) override { in_->sigmoid_gate(x, g, o); }
  void swiglu(const Mat& gu, const Mat& o) override { in_->swiglu(gu, o); }
  bool linear_swiglu(const Mat& x, const Mat& w, const Mat& o) override { return in_->linear_swiglu(x, w, o); }
  void feed_picks(const int32_t* p, const int32_t* f, int64_t n, int32_t* ids) override { in_->feed_picks(p, f, n, ids); }
  void gather_rows(const Mat& s, const int32_t* i, const Mat& d) override { in_->gather_rows(s, i, d); }
  void argmax(const Mat& l, int32_t* o) override { in_->argmax(l, o); }
  void argmax_part(const Mat& l, int64_t off, ArgmaxPart* o) override { in_->argmax_part(l, off, o); }
  void argmax_merge(const ArgmaxPart* p, int64_t r, int w, int32_t* o) override { in_->argmax_merge(p, r, w, o); }
  void sample(const Mat& l, const SampleState& st, int32_t* o) override { in_->sample(l, st, o); }
  bool sample_split() const override { return in_->sample_split(); }
  void sample_part(const Mat& l, int64_t off, const SampleState& st, SampleCandidate* o) override {
    in_->sample_part(l, off, st, o);
  }
  void sample_merge(const SampleCandidate* p, int64_t r, int w, const SampleState& st, int32_t* o) override {
    in_->sample_merge(p, r, w, st, o);
  }
  void logprobs(const Mat& l, const int32_t* c, int n, float* clp, int32_t* ti, float* tl) override {
    in_->logprobs(l, c, n, clp, ti, tl);
  }
  void to_f32(const Mat& s, float* d) override { in_->to_f32(s, d); }
  void causal_conv1d(const CausalConv1dParams& p) override { in_->causal_conv1d(p); }
  void gated_delta_rule(const GatedDeltaRuleParams& p) override { in_->gated_delta_rule(p); }
  void gated_rmsnorm(const GatedRmsNormParams& p) override { in_->gated_rmsnorm(p); }

 protected:
  std::unique_ptr<Backend> in_;
};

}  // namespace ingot
