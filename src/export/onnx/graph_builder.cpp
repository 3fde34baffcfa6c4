#include "export/onnx/graph_builder.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <onnx/onnx_pb.h>

#include "core/error.h"

namespace ingot::onnx_export {

namespace {

// Runtimes map external data in place; 64 bytes keeps every weight aligned for vector loads.
constexpr uint64_t kAlign = 64;

void set_attr(onnx::NodeProto& n, const Attr& a) {
  onnx::AttributeProto* p = n.add_attribute();
  p->set_name(a.name);
  if (auto* i = std::get_if<int64_t>(&a.value)) {
    p->set_type(onnx::AttributeProto::INT);
    p->set_i(*i);
  } else if (auto* f = std::get_if<float>(&a.value)) {
    p->set_type(onnx::AttributeProto::FLOAT);
    p->set_f(*f);
  } else if (auto* s = std::get_if<std::string>(&a.value)) {
    p->set_type(onnx::AttributeProto::STRING);
    p->set_s(*s);
  } else if (auto* g = std::get_if<Subgraph>(&a.value)) {
    p->set_type(onnx::AttributeProto::GRAPH);
    *p->mutable_g() = *g->graph;
  } else {
    p->set_type(onnx::AttributeProto::INTS);
    for (int64_t v : std::get<std::vector<int64_t>>(a.value)) p->add_ints(v);
  }
}

void set_value_info(onnx::ValueInfoProto& vi, const std::string& name, OnnxType type, const std::vector<Dim>& dims) {
  vi.set_name(name);
  onnx::TypeProto_Tensor* t = vi.mutable_type()->mutable_tensor_type();
  t->set_elem_type(int32_t(type));
  onnx::TensorShapeProto* s = t->mutable_shape();
  for (const Dim& d : dims) {
    onnx::TensorShapeProto_Dimension* x = s->add_dim();
    if (auto* v = std::get_if<int64_t>(&d)) x->set_dim_value(*v);
    else x->set_dim_param(std::get<std::string>(d));
  }
}

}  // namespace

OnnxType onnx_type(DType t) {
  switch (t) {
    case DType::F32: return OnnxType::Float;
    case DType::F16: return OnnxType::Float16;
    case DType::BF16: return OnnxType::BFloat16;
    case DType::I64: return OnnxType::Int64;
    default: throw Error("onnx export: dtype " + std::string(dtype_name(t)) + " has no ONNX type here");
  }
}

GraphBuilder::GraphBuilder(const std::string& graph_name, int64_t opset, int64_t ir_version,
                           const std::string& data_path, const std::string& data_name)
    : model_(std::make_unique<onnx::ModelProto>()), opset_(opset), data_path_(data_path), data_name_(data_name) {
  model_->set_ir_version(ir_version);
  onnx::OperatorSetIdProto* o = model_->add_opset_import();
  o->set_domain("");
  o->set_version(opset);
  graph_ = model_->mutable_graph();
  graph_->set_name(graph_name);
  data_.open(data_path, std::ios::binary | std::ios::trunc);
  if (!data_) throw Error("onnx export: cannot create " + data_path);
}

GraphBuilder::~GraphBuilder() = default;

std::string GraphBuilder::fresh(const std::string& hint) {
  return (hint.empty() ? std::string("v") : hint) + "_" + std::to_string(counter_++);
}

std::string GraphBuilder::weight(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                 const void* data) {
  uint64_t bytes = dtype_size(dtype);
  for (int64_t d : shape) bytes *= uint64_t(d);
  const uint64_t pad = (kAlign - data_offset_ % kAlign) % kAlign;
  const char zeros[kAlign] = {};
  data_.write(zeros, std::streamsize(pad));
  data_offset_ += pad;
  data_.write(static_cast<const char*>(data), std::streamsize(bytes));
  if (!data_) throw Error("onnx export: writing " + data_path_ + " failed (disk full?)");

  onnx::TensorProto* t = graph_->add_initializer();
  t->set_name(name);
  t->set_data_type(int32_t(onnx_type(dtype)));
  for (int64_t d : shape) t->add_dims(d);
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto kv = [&](const char* k, const std::string& v) {
    onnx::StringStringEntryProto* e = t->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  kv("location", data_name_);
  kv("offset", std::to_string(data_offset_));
  kv("length", std::to_string(bytes));
  data_offset_ += bytes;
  return name;
}

std::string GraphBuilder::const_i64(const std::vector<int64_t>& values, const std::vector<int64_t>& shape,
                                    const std::string& hint) {
  onnx::TensorProto* t = graph_->add_initializer();
  const std::string name = fresh(hint.empty() ? "const" : hint);
  t->set_name(name);
  t->set_data_type(int32_t(OnnxType::Int64));
  for (int64_t d : shape) t->add_dims(d);
  t->set_raw_data(values.data(), values.size() * sizeof(int64_t));
  return name;
}

std::string GraphBuilder::const_f32(const std::vector<float>& values, const std::vector<int64_t>& shape,
                                    const std::string& hint) {
  onnx::TensorProto* t = graph_->add_initializer();
  const std::string name = fresh(hint.empty() ? "const" : hint);
  t->set_name(name);
  t->set_data_type(int32_t(OnnxType::Float));
  for (int64_t d : shape) t->add_dims(d);
  t->set_raw_data(values.data(), values.size() * sizeof(float));
  return name;
}

std::string GraphBuilder::scalar_float(DType dtype, float v, const std::string& hint) {
  if (dtype == DType::F32) return scalar_f32(v, hint);
  onnx::TensorProto* t = graph_->add_initializer();
  const std::string name = fresh(hint.empty() ? "const" : hint);
  t->set_name(name);
  t->set_data_type(int32_t(onnx_type(dtype)));
  const uint16_t bits = dtype == DType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
  t->set_raw_data(&bits, sizeof bits);
  return name;
}

std::vector<std::string> GraphBuilder::node(const std::string& op, const std::vector<std::string>& inputs, int outputs,
                                            const std::vector<Attr>& attrs, const std::string& hint) {
  std::vector<std::string> outs;
  const std::string base = hint.empty() ? op : hint;
  for (int i = 0; i < outputs; ++i) outs.push_back(fresh(base));
  node_named(op, inputs, outs, attrs);
  return outs;
}

std::string GraphBuilder::op(const std::string& op, const std::vector<std::string>& inputs,
                             const std::vector<Attr>& attrs, const std::string& hint) {
  return node(op, inputs, 1, attrs, hint)[0];
}

void GraphBuilder::node_named(const std::string& op, const std::vector<std::string>& inputs,
                              const std::vector<std::string>& outputs, const std::vector<Attr>& attrs) {
  onnx::NodeProto* n = graph_->add_node();
  n->set_op_type(op);
  // A body's node names carry the body's name: node names stay unique across the model.
  const std::string scope = open_.empty() ? std::string() : graph_->name() + "/";
  n->set_name(scope + op + "_" + std::to_string(graph_->node_size() - 1));
  for (const std::string& i : inputs) n->add_input(i);
  for (const std::string& o : outputs) n->add_output(o);
  for (const Attr& a : attrs) set_attr(*n, a);
}

void GraphBuilder::input(const std::string& name, OnnxType type, const std::vector<Dim>& dims) {
  set_value_info(*graph_->add_input(), name, type, dims);
}

void GraphBuilder::output(const std::string& name, OnnxType type, const std::vector<Dim>& dims) {
  set_value_info(*graph_->add_output(), name, type, dims);
}

void GraphBuilder::begin_subgraph(const std::string& name) {
  auto body = std::make_shared<onnx::GraphProto>();
  body->set_name(name);
  open_.emplace_back(graph_, body);
  graph_ = body.get();
}

Subgraph GraphBuilder::end_subgraph() {
  if (open_.empty()) throw Error("onnx export: end_subgraph without begin_subgraph");
  Subgraph s{open_.back().second};
  graph_ = open_.back().first;
  open_.pop_back();
  return s;
}

namespace {
int64_t count_nodes(const onnx::GraphProto& g) {
  int64_t n = g.node_size();
  for (const onnx::NodeProto& node : g.node())
    for (const onnx::AttributeProto& a : node.attribute())
      if (a.has_g()) n += count_nodes(a.g());
  return n;
}
void collect_ops(const onnx::GraphProto& g, std::set<std::string>& s) {
  for (const onnx::NodeProto& node : g.node()) {
    s.insert(node.op_type());
    for (const onnx::AttributeProto& a : node.attribute())
      if (a.has_g()) collect_ops(a.g(), s);
  }
}
}  // namespace

int64_t GraphBuilder::node_count() const { return count_nodes(model_->graph()); }

std::vector<std::string> GraphBuilder::op_types() const {
  std::set<std::string> s;
  collect_ops(model_->graph(), s);
  return {s.begin(), s.end()};
}

void GraphBuilder::save(const std::string& model_path, const std::string& producer_version) {
  if (!open_.empty()) throw Error("onnx export: a subgraph was left open");
  model_->set_producer_name("ingot");
  model_->set_producer_version(producer_version);
  data_.flush();
  data_.close();
  if (!data_) throw Error("onnx export: writing " + data_path_ + " failed (disk full?)");
  std::ofstream out(model_path, std::ios::binary | std::ios::trunc);
  if (!out || !model_->SerializeToOstream(&out)) throw Error("onnx export: writing " + model_path + " failed");
  out.close();
  if (!out) throw Error("onnx export: writing " + model_path + " failed (disk full?)");
}

}  // namespace ingot::onnx_export
