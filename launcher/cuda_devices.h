// CUDA devices: how many this process would see, for `--nproc_per_node gpu|auto`, without loading CUDA.
//
// count_cuda_devices reads /proc/driver/nvidia/gpus (or /dev/nvidiaN) and the real environment's
// CUDA_VISIBLE_DEVICES; visible_cuda_devices is its pure part. Neither throws: an unreadable directory
// counts as no device. Thread-safe (no shared state).
#pragma once

#include <optional>
#include <string>

namespace ddprun::launcher {

// The number of CUDA devices this process would see: NVIDIA GPUs listed under /proc/driver/nvidia/gpus (or
// /dev/nvidiaN), narrowed by CUDA_VISIBLE_DEVICES from the real environment. Never loads CUDA.
int count_cuda_devices();

// The pure part of count_cuda_devices: `physical` devices narrowed by a CUDA_VISIBLE_DEVICES value (nullopt =
// unset). Like the CUDA runtime, the list is read up to its first invalid entry (a negative or out-of-range
// index, a duplicate, garbage); GPU-/MIG- UUID entries count as one device each.
int visible_cuda_devices(int physical, const std::optional<std::string>& cuda_visible_devices);

}  // namespace ddprun::launcher
