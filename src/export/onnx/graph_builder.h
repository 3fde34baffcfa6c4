// GraphBuilder: a small writer of ONNX graphs, ours. No library available here writes ONNX graphs from
// C++ (Debian's libonnx-dev ships the protobuf schema classes and a checker, not a builder), so this
// wraps the generated protobuf classes with what an exporter needs: unique value names, nodes with
// attributes, graph inputs/outputs with symbolic dims, small constants stored inline, and weights
// written as external data into one file beside the model as they are added (the model proto must stay
// under protobuf's 2 GB limit, and streaming keeps each weight in memory only once).
#pragma once
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/dtype.h"

namespace onnx {
class ModelProto;
class GraphProto;
}  // namespace onnx

namespace ingot::onnx_export {

// ONNX's TensorProto.DataType numbers of the dtypes we write (the schema's enum values).
enum class OnnxType : int32_t { Float = 1, Int64 = 7, Bool = 9, Float16 = 10, BFloat16 = 16 };
OnnxType onnx_type(DType t);  // F32, F16, BF16 and I64; Error for the rest

// A graph built as a node's body (Scan's): shared so an Attr can carry it by value.
struct Subgraph {
  std::shared_ptr<onnx::GraphProto> graph;
};

// One attribute value: int, float, string, list of ints, graph.
using AttrValue = std::variant<int64_t, float, std::string, std::vector<int64_t>, Subgraph>;
struct Attr {
  std::string name;
  AttrValue value;
};

// A graph input/output dimension: a fixed size or a symbolic name ("batch", "sequence").
using Dim = std::variant<int64_t, std::string>;

class GraphBuilder {
 public:
  // `data_path` is created (truncated) now: every weight added goes there; `data_name` is the name the
  // model records for it (relative to the model file's folder).
  GraphBuilder(const std::string& graph_name, int64_t opset, int64_t ir_version, const std::string& data_path,
               const std::string& data_name);
  ~GraphBuilder();
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;

  int64_t opset() const { return opset_; }

  // A weight of `shape` (row-major bytes of `dtype`) written to the external data file at a 64-byte
  // aligned offset (runtimes map it in place). Returns its value name (`name`, which must be unique).
  std::string weight(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data);
  // Small constants kept inside the model (shape vectors, scalars, index ranges).
  std::string const_i64(const std::vector<int64_t>& values, const std::vector<int64_t>& shape, const std::string& hint);
  std::string const_i64(const std::vector<int64_t>& values, const std::string& hint) {
    return const_i64(values, {int64_t(values.size())}, hint);
  }
  std::string scalar_i64(int64_t v, const std::string& hint) { return const_i64({v}, {}, hint); }
  std::string const_f32(const std::vector<float>& values, const std::vector<int64_t>& shape, const std::string& hint);
  std::string scalar_f32(float v, const std::string& hint) { return const_f32({v}, {}, hint); }
  // A scalar of a floating dtype (f32, f16, bf16), its value rounded to that dtype.
  std::string scalar_float(DType dtype, float v, const std::string& hint);

  // A node with fresh outputs (their names derived from `hint`); returns the output names.
  std::vector<std::string> node(const std::string& op, const std::vector<std::string>& inputs, int outputs,
                                const std::vector<Attr>& attrs, const std::string& hint);
  // The one-output case.
  std::string op(const std::string& op, const std::vector<std::string>& inputs, const std::vector<Attr>& attrs = {},
                 const std::string& hint = "");
  // A node whose outputs have the given names (graph outputs).
  void node_named(const std::string& op, const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
                  const std::vector<Attr>& attrs = {});

  // Between begin_subgraph and end_subgraph every node, constant, input and output goes into a fresh body
  // graph (a Scan's), which end_subgraph returns for the node's `body` attribute. The body may read the
  // outer graph's values by name (ONNX's outer-scope rule); names stay unique across both.
  void begin_subgraph(const std::string& name);
  Subgraph end_subgraph();

  // A fresh unique value name (for a node_named output that is not a graph output).
  std::string fresh_name(const std::string& hint) { return fresh(hint); }

  void input(const std::string& name, OnnxType type, const std::vector<Dim>& dims);
  void output(const std::string& name, OnnxType type, const std::vector<Dim>& dims);

  // Writes the model proto to `model_path` and flushes the external data file. Error on I/O failure.
  void save(const std::string& model_path, const std::string& producer_version);

  uint64_t data_bytes() const { return data_offset_; }
  int64_t node_count() const;
  std::vector<std::string> op_types() const;  // distinct, sorted, bodies included: what the contract lists

 private:
  std::string fresh(const std::string& hint);
  std::unique_ptr<onnx::ModelProto> model_;
  onnx::GraphProto* graph_ = nullptr;  // owned by model_, or the open subgraph's (open_ holds it)
  std::vector<std::pair<onnx::GraphProto*, std::shared_ptr<onnx::GraphProto>>> open_;  // enclosing graph, body
  int64_t opset_ = 0;
  int64_t counter_ = 0;
  std::string data_path_, data_name_;
  std::ofstream data_;
  uint64_t data_offset_ = 0;
};

}  // namespace ingot::onnx_export
