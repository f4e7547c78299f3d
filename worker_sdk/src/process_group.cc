// DType/ReduceOp helpers and the single-rank group (make_single_process_group).
#include "ddprun/process_group.h"

#include <atomic>
#include <cstring>

#include "ddprun/backends.h"

namespace ddprun::sdk {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUInt8:
      return 1;
  }
  throw std::invalid_argument("unknown DType " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

namespace {

class SingleProcessGroup final : public ProcessGroup {
 public:
  SingleProcessGroup() : ProcessGroup(0, 1) {}
  const char* backend() const override { return "single"; }
  void all_reduce(void*, size_t, DType dtype, ReduceOp) override { check("all_reduce", dtype); }
  void broadcast(void*, size_t, DType dtype, int root) override {
    check("broadcast", dtype);
    if (root != 0)
      throw std::invalid_argument("broadcast: root " + std::to_string(root) + " in a group of one");
  }
  void all_gather(const void* in, void* out, size_t count, DType dtype) override {
    check("all_gather", dtype);
    if (count > 0 && in != out) std::memmove(out, in, count * dtype_size(dtype));
  }
  void barrier() override { check("barrier", DType::kUInt8); }
  void abort() override { aborted_.store(true); }

 private:
  void check(const char* op, DType dtype) const {
    dtype_size(dtype);  // validates
    if (aborted_.load()) throw CollectiveError(std::string(op) + ": the process group is aborted", 0);
  }
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<ProcessGroup> make_single_process_group() {
  return std::make_unique<SingleProcessGroup>();
}

}  // namespace ddprun::sdk
