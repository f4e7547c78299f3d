// ddprun::sdk::state for libtorch tensors (ddprun/torch_state.h): adapters to the torch-free core (state.h).
#include "ddprun/torch_state.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstring>
#include <stdexcept>

namespace ddprun::sdk::state {
namespace {

constexpr std::pair<c10::ScalarType, const char*> kTypes[] = {{c10::kFloat, "float32"},
                                                              {c10::kDouble, "float64"},
                                                              {c10::kHalf, "float16"},
                                                              {c10::kBFloat16, "bfloat16"},
                                                              {c10::kLong, "int64"},
                                                              {c10::kInt, "int32"},
                                                              {c10::kShort, "int16"},
                                                              {c10::kChar, "int8"},
                                                              {c10::kByte, "uint8"},
                                                              {c10::kBool, "bool"},
                                                              {c10::kComplexFloat, "complex64"},
                                                              {c10::kComplexDouble, "complex128"},
                                                              {c10::kComplexHalf, "complex32"}};

// `t` as dense contiguous CPU memory (a copy when it is not already).
at::Tensor host_contiguous(const at::Tensor& t) {
  at::Tensor h = t.detach();
  if (h.is_conj()) h = h.resolve_conj();
  if (h.is_neg()) h = h.resolve_neg();
  if (!h.device().is_cpu()) h = h.to(at::kCPU);
  return h.is_contiguous() ? h : h.contiguous();
}

const at::Tensor& find(const std::map<std::string, at::Tensor>& tensors, const std::string& name) {
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    throw StateError("ddprun::sdk::state: the loaded version has no tensor '" + name +
                     "' (saved by another program, or a model of another shape?)");
  }
  return it->second;
}

void restore_into(at::Tensor& target, const at::Tensor& saved, const std::string& name) {
  if (!target.defined()) return;  // a buffer the module declares without a value (none saved either)
  if (target.sizes() != saved.sizes() || target.scalar_type() != saved.scalar_type()) {
    throw StateError("ddprun::sdk::state: tensor '" + name + "' was saved as " +
                     dtype_name(saved.scalar_type()) + " of shape " + c10::str(saved.sizes()) +
                     ", the module's is " + dtype_name(target.scalar_type()) + " of shape " +
                     c10::str(target.sizes()));
  }
  target.copy_(saved);
}

}  // namespace

std::string dtype_name(c10::ScalarType type) {
  for (const auto& [t, name] : kTypes) {
    if (t == type) return name;
  }
  throw std::invalid_argument(std::string("ddprun::sdk::state: tensors of dtype ") + c10::toString(type) +
                              " cannot be saved");
}

std::optional<c10::ScalarType> scalar_type(const std::string& name) {
  for (const auto& [t, n] : kTypes) {
    if (name == n) return t;
  }
  return std::nullopt;
}

bool save(int64_t step, const NamedTensors& tensors, bool async) {
  if (!enabled()) return save(step, std::span<const Buffer>(), async);  // the one warning, no copies
  std::vector<at::Tensor> hosts;  // alive until the core has written (sync) or copied (async) them
  std::vector<Buffer> buffers;
  hosts.reserve(tensors.size());
  buffers.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || t.layout() != c10::kStrided || t.is_quantized() || t.is_meta()) {
      throw std::invalid_argument("ddprun::sdk::state::save(step=" + std::to_string(step) + "): tensor '" +
                                  name + "' is not a dense tensor with storage");
    }
    Buffer b;
    b.name = name;
    b.dtype = dtype_name(t.scalar_type());
    b.shape = t.sizes().vec();
    b.device = t.device().str();
    hosts.push_back(host_contiguous(t));
    b.data = hosts.back().data_ptr();
    b.nbytes = hosts.back().nbytes();
    buffers.push_back(std::move(b));
  }
  return save(step, std::span<const Buffer>(buffers), async);
}

std::optional<LoadedTensors> load_tensors(Context& ctx, std::chrono::milliseconds timeout,
                                          std::optional<c10::Device> map_location) {
  auto version = load(ctx, timeout);
  if (!version) return std::nullopt;
  LoadedTensors out;
  out.step = version->step();
  out.attempt = version->attempt();
  const bool cuda = torch::cuda::is_available();
  const auto keep = version->keepalive();
  for (size_t i = 0; i < version->tensors().size(); ++i) {
    const TensorView& v = version->tensors()[i];
    const auto type = scalar_type(v.dtype);
    if (!type) {
      throw StateError("ddprun::sdk::state::load(): tensor '" + v.name + "' is of dtype " + v.dtype +
                       ", which this libtorch does not have");
    }
    const auto options = at::TensorOptions().dtype(*type);
    at::Tensor t = v.nbytes ? at::from_blob(
                                  const_cast<void*>(v.data), v.shape, [keep](void*) {}, options)
                            : at::empty(v.shape, options);
    if (map_location) {
      t = t.to(*map_location);
    } else if (v.device != "cpu" && cuda) {
      t = t.to(c10::Device(v.device));
    }
    out.tensors[v.name.empty() ? std::to_string(i) : v.name] = std::move(t);
  }
  return out;
}

void add_module(NamedTensors& out, const torch::nn::Module& module, const std::string& prefix) {
  for (const auto& p : module.named_parameters(true)) out.emplace_back(prefix + p.key(), p.value());
  for (const auto& b : module.named_buffers(true)) out.emplace_back(prefix + b.key(), b.value());
}

void restore_module(torch::nn::Module& module, const std::map<std::string, at::Tensor>& tensors,
                    const std::string& prefix) {
  c10::NoGradGuard no_grad;
  for (auto& p : module.named_parameters(true))
    restore_into(p.value(), find(tensors, prefix + p.key()), prefix + p.key());
  for (auto& b : module.named_buffers(true))
    restore_into(b.value(), find(tensors, prefix + b.key()), prefix + b.key());
}

void add_optimizer(NamedTensors& out, torch::optim::Optimizer& optimizer, const std::string& name) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::string bytes;
  archive.save_to([&](const void* data, size_t n) {
    bytes.append(static_cast<const char*>(data), n);
    return n;
  });
  at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::TensorOptions().dtype(c10::kByte));
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  out.emplace_back(name, std::move(t));
}

void restore_optimizer(torch::optim::Optimizer& optimizer, const std::map<std::string, at::Tensor>& tensors,
                       const std::string& name, std::optional<c10::Device> device) {
  const at::Tensor t = host_contiguous(find(tensors, name));
  if (t.scalar_type() != c10::kByte || t.dim() != 1) {
    throw StateError("ddprun::sdk::state: tensor '" + name + "' is not an optimizer's archive (uint8, 1-d)");
  }
  torch::serialize::InputArchive archive;
  archive.load_from(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()),
                    device ? c10::optional<c10::Device>(*device) : c10::optional<c10::Device>());
  optimizer.load(archive);
}

}  // namespace ddprun::sdk::state
