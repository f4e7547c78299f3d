// ddprun::sdk::state for libtorch programs: named torch::Tensors saved and loaded through ddprun/state.h
// (same files, rules and guarantees; docs/state.md, "The C++ API"), with helpers for a module's parameters
// and buffers and an optimizer's state, so that a resumed run continues bit for bit.
//
//   namespace state = ddprun::sdk::state;
//   if (auto got = state::load_tensors(*ctx)) {              // every rank calls it
//     state::restore_module(*model, got->tensors);            // "model.<name>" of every parameter and buffer
//     state::restore_optimizer(opt, got->tensors);            // "optimizer": its torch::serialize archive
//     start = got->step + 1;
//   }
//   ...
//   state::NamedTensors t;
//   state::add_module(t, *model);
//   state::add_optimizer(t, opt);
//   state::save(step, t, /*async=*/true);
//
// save(step, tensors, async): each tensor dense (strided), of a dtype torch and the file format both name;
// a CUDA or non-contiguous tensor is first copied into contiguous CPU memory (then, with async, into the
// staging buffer: the copy to the host is part of the time save() takes). Otherwise as state::save (returns
// false outside a job with --state_memory; StateMemoryError, StateError; std::invalid_argument for a tensor
// it cannot save or a name given twice, before anything is written). load_tensors(ctx, timeout,
// map_location): as state::load, the tensors by name (a version of the Python writer: by index, "0", "1",
// ...), backed by the version's private mapping (no copy until written; a write copies the page, the file is
// never changed). A tensor saved from a CUDA device comes back there when CUDA is available (map_location
// overrides), else on the CPU. add_optimizer saves the optimizer's own serialization
// (torch::serialize::OutputArchive: every libtorch optimizer, its per-parameter state such as SGD's momentum
// buffers and its param groups' options) as one uint8 tensor; restore_optimizer loads it into an optimizer
// built over the same parameters. restore_module and restore_optimizer throw StateError naming a tensor the
// version lacks or one of another shape or dtype. Same threads as ddprun/state.h (one thread calls these).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/state.h"

namespace ddprun::sdk::state {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct LoadedTensors {
  int64_t step = 0;
  int attempt = 0;
  std::map<std::string, at::Tensor> tensors;
};

bool save(int64_t step, const NamedTensors& tensors, bool async = false);

std::optional<LoadedTensors> load_tensors(Context& ctx,
                                          std::chrono::milliseconds timeout = std::chrono::minutes(5),
                                          std::optional<c10::Device> map_location = std::nullopt);

// torch's name of a scalar type as the file records it ("float32"); std::invalid_argument when the format
// has none. And back (nullopt for a name libtorch has no type of).
std::string dtype_name(c10::ScalarType type);
std::optional<c10::ScalarType> scalar_type(const std::string& name);

// Appends prefix + name of each of `module`'s parameters and buffers (recursively: "model.0.weight").
void add_module(NamedTensors& out, const torch::nn::Module& module, const std::string& prefix = "model.");
// Copies them back (no gradient recorded); every parameter and buffer must be in `tensors`.
void restore_module(torch::nn::Module& module, const std::map<std::string, at::Tensor>& tensors,
                    const std::string& prefix = "model.");

// Appends `name`: the optimizer's serialization as a uint8 tensor.
void add_optimizer(NamedTensors& out, torch::optim::Optimizer& optimizer,
                   const std::string& name = "optimizer");
// Loads it into `optimizer` (its tensors onto `device`; default: where they were saved from).
void restore_optimizer(torch::optim::Optimizer& optimizer, const std::map<std::string, at::Tensor>& tensors,
                       const std::string& name = "optimizer",
                       std::optional<c10::Device> device = std::nullopt);

}  // namespace ddprun::sdk::state
