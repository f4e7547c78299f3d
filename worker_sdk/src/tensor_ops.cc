// torch::Tensor adapters over ProcessGroup (see ddprun/tensor_ops.h).
#include "ddprun/tensor_ops.h"

#include <ATen/ops/empty.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace ddprun::sdk {

DType to_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return DType::kFloat32;
    case c10::ScalarType::Double:
      return DType::kFloat64;
    case c10::ScalarType::Half:
      return DType::kFloat16;
    case c10::ScalarType::BFloat16:
      return DType::kBFloat16;
    case c10::ScalarType::Int:
      return DType::kInt32;
    case c10::ScalarType::Long:
      return DType::kInt64;
    case c10::ScalarType::Byte:
      return DType::kUInt8;
    default:
      throw std::invalid_argument(
          std::string("ddprun: tensors of dtype ") + c10::toString(type) +
          " are not supported (float32, float64, float16, bfloat16, int32, int64, uint8)");
  }
}

void check_tensor(const ProcessGroup& pg, const at::Tensor& t, const char* op) {
  const std::string where = std::string("ddprun ") + op + " on a " + pg.backend() + " process group: ";
  if (!t.defined()) throw std::invalid_argument(where + "the tensor is undefined");
  if (!t.is_contiguous()) {
    throw std::invalid_argument(where +
                                "the tensor is not contiguous (call .contiguous() and copy the result back)");
  }
  if (t.layout() != c10::kStrided)
    throw std::invalid_argument(where + "only dense (strided) tensors are supported");
  to_dtype(t.scalar_type());
  const std::string backend = pg.backend();
  if (backend == "nccl" && !t.is_cuda()) {
    throw std::invalid_argument(where + "the tensor is on " + t.device().str() + "; NCCL needs CUDA tensors");
  }
  if (backend == "nccl" && t.device().index() != pg.device_index()) {
    throw std::invalid_argument(where + "the tensor is on " + t.device().str() +
                                " but the process group's communicator is on cuda:" +
                                std::to_string(pg.device_index()) + " (LOCAL_RANK): move it there first");
  }
  if (backend == "cpu" && !t.is_cpu()) {
    throw std::invalid_argument(where + "the tensor is on " + t.device().str() +
                                "; the CPU backend needs CPU tensors (use the NCCL backend for CUDA)");
  }
}

void wait_for_producers(const at::Tensor& t) {
  if (!t.is_cuda()) return;
  c10::impl::VirtualGuardImpl guard(t.device().type());
  guard.getStream(t.device()).synchronize();
}

void all_reduce(ProcessGroup& pg, at::Tensor& t, ReduceOp op) {
  check_tensor(pg, t, "all_reduce");
  wait_for_producers(t);
  pg.all_reduce(t.data_ptr(), static_cast<size_t>(t.numel()), to_dtype(t.scalar_type()), op);
}

void broadcast(ProcessGroup& pg, at::Tensor& t, int root) {
  check_tensor(pg, t, "broadcast");
  wait_for_producers(t);
  pg.broadcast(t.data_ptr(), static_cast<size_t>(t.numel()), to_dtype(t.scalar_type()), root);
}

at::Tensor all_gather(ProcessGroup& pg, const at::Tensor& t) {
  check_tensor(pg, t, "all_gather");
  wait_for_producers(t);
  std::vector<int64_t> shape{pg.size()};
  shape.insert(shape.end(), t.sizes().begin(), t.sizes().end());
  at::Tensor out = at::empty(shape, t.options());
  pg.all_gather(t.data_ptr(), out.data_ptr(), static_cast<size_t>(t.numel()), to_dtype(t.scalar_type()));
  return out;
}

}  // namespace ddprun::sdk
