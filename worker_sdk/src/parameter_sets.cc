// Parameter-list helpers of GradientSynchronizer (see parameter_sets.h).
#include "parameter_sets.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <unordered_set>

#include "ddprun/tensor_ops.h"
#include "fnv1a.h"

namespace ddprun::sdk {

std::string tensor_kind(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + "@" + t.device().str();
}

std::vector<at::Tensor> unique_tensors(const std::vector<at::Tensor>& ts, bool trainable_only) {
  std::unordered_set<const void*> seen;
  std::vector<at::Tensor> out;
  for (const auto& t : ts) {
    if (!t.defined() || (trainable_only && !t.requires_grad())) continue;
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  return out;
}

std::vector<std::vector<size_t>> assign_buckets(const std::vector<at::Tensor>& ts, size_t first_cap,
                                                size_t cap) {
  struct Open {
    std::vector<size_t> members;
    size_t bytes = 0;
    bool first = true;
  };
  std::vector<std::vector<size_t>> buckets;
  std::map<std::string, Open> open;
  for (size_t p = ts.size(); p-- > 0;) {
    Open& o = open[tensor_kind(ts[p])];
    o.members.push_back(p);
    o.bytes += static_cast<size_t>(ts[p].numel()) * ts[p].element_size();
    if (o.bytes >= (o.first ? first_cap : cap)) {
      buckets.push_back(std::move(o.members));
      o = Open{.first = false};
    }
  }
  for (auto& [kind, o] : open) {
    if (!o.members.empty()) buckets.push_back(std::move(o.members));
  }
  std::sort(buckets.begin(), buckets.end(),
            [](const auto& a, const auto& b) { return a.front() > b.front(); });
  return buckets;
}

void verify_same_model(ProcessGroup& pg, const std::vector<at::Tensor>& params) {
  // A fingerprint of the count, dtypes and shapes: FNV-1a over their little-endian 64-bit values.
  std::string bytes;
  auto mix = [&bytes](uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  mix(params.size());
  for (const auto& p : params) {
    mix(static_cast<uint64_t>(p.scalar_type()));
    mix(static_cast<uint64_t>(p.dim()));
    for (int64_t d : p.sizes()) mix(static_cast<uint64_t>(d));
  }
  const uint64_t h = fnv1a(bytes);
  at::Tensor mine = at::empty({1}, at::TensorOptions().dtype(at::kLong));
  mine.fill_(static_cast<int64_t>(h));
  mine = mine.to(params.front().device());
  at::Tensor all = all_gather(pg, mine).cpu();
  for (int r = 0; r < pg.size(); ++r) {
    if (all[r].item<int64_t>() != static_cast<int64_t>(h)) {
      throw std::runtime_error("GradientSynchronizer: rank " + std::to_string(r) +
                               " has different parameters (count, shapes or dtypes) than rank " +
                               std::to_string(pg.rank()) + ": every rank must build the same model");
    }
  }
}

void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& ts, int root) {
  at::NoGradGuard no_grad;
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < ts.size(); ++i) groups[tensor_kind(ts[i])].push_back(i);
  for (const auto& [kind, group] : groups) {
    std::vector<at::Tensor> flat;
    for (size_t i : group) flat.push_back(ts[i].detach().reshape(-1));
    at::Tensor buf = at::cat(flat);
    broadcast(pg, buf, root);
    int64_t off = 0;
    for (size_t i : group) {
      const int64_t n = ts[i].numel();
      ts[i].detach().copy_(buf.narrow(0, off, n).view(ts[i].sizes()));
      off += n;
    }
  }
}

}  // namespace ddprun::sdk
