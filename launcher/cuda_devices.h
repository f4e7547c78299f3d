// GPUs: how many this process would see, for `--nproc_per_node gpu|auto`, without loading CUDA or HIP, as
// torch.cuda.device_count() counts them: NVIDIA GPUs, else AMD GPUs (ROCm: torch's ROCm build answers
// torch.cuda.device_count() with the AMD GPUs).
//
// count_gpu_devices reads the machine (/proc, /sys, /dev) and the real environment; count_cuda_devices,
// count_rocm_devices and the visible_* functions are its parts. None of them throws except
// count_rocm_devices / visible_rocm_devices for the one setting torch refuses (more HIP_VISIBLE_DEVICES
// entries than ROCR_VISIBLE_DEVICES): std::invalid_argument with torch's words. An unreadable directory
// counts as no device. Thread-safe (no shared state).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace ddprun::launcher {

// NVIDIA GPUs if there are any (count_cuda_devices), else AMD GPUs (count_rocm_devices of /sys and /dev),
// with the real environment.
int count_gpu_devices();

// The number of CUDA devices this process would see: NVIDIA GPUs listed under /proc/driver/nvidia/gpus (or
// /dev/nvidiaN), narrowed by CUDA_VISIBLE_DEVICES from the real environment. Never loads CUDA.
int count_cuda_devices();

// The pure part of count_cuda_devices: `physical` devices narrowed by a CUDA_VISIBLE_DEVICES value (nullopt =
// unset). Like the CUDA runtime, the list is read up to its first invalid entry (a negative or out-of-range
// index, a duplicate, garbage); GPU-/MIG- UUID entries count as one device each.
int visible_cuda_devices(int physical, const std::optional<std::string>& cuda_visible_devices);

// AMD GPUs as ROCm's runtime finds them: the nodes of the KFD topology
// (<sys>/class/kfd/kfd/topology/nodes/<n>/) with a non-zero gpu_id (CPU nodes have 0) whose render node
// <dev>/dri/renderD<drm_render_minor> exists (a container sees the host's /sys but only its own GPUs' device
// files), narrowed by visible_rocm_devices with env's HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES and
// CUDA_VISIBLE_DEVICES.
int count_rocm_devices(const std::filesystem::path& sys, const std::filesystem::path& dev,
                       const std::map<std::string, std::string>& env);

// The pure part of count_rocm_devices: `physical` GPUs narrowed as torch's ROCm build does
// (torch.cuda._parse_visible_devices, then _device_count_amdsmi's trim): ROCR_VISIBLE_DEVICES alone gives
// its number of entries; HIP_VISIBLE_DEVICES (preferred, with or without ROCR_VISIBLE_DEVICES), else
// CUDA_VISIBLE_DEVICES, is read as a list of ordinals (each entry's leading digits, as strtoul) up to the
// first negative or unparsable one, a repeated ordinal meaning none at all, and cut at the first ordinal
// >= `physical`; GPU- entries count as one device each. Unset: every GPU. Throws std::invalid_argument when
// HIP_VISIBLE_DEVICES has more entries than ROCR_VISIBLE_DEVICES (torch raises RuntimeError).
int visible_rocm_devices(int physical, const std::map<std::string, std::string>& env);

}  // namespace ddprun::launcher
