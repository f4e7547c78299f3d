// Compiled instead of nccl_process_group.cc when ddprun is built without NCCL (DDPRUN_WITH_NCCL off).
#include <stdexcept>

#include "ddprun/backends.h"

namespace ddprun::sdk {

std::unique_ptr<ProcessGroup> make_nccl_process_group(rdzv::Store&, const std::string&, int, int, int,
                                                      const ProcessGroupOptions&) {
  throw std::runtime_error(
      "ddprun was built without NCCL: rebuild with -DDDPRUN_WITH_NCCL=ON (CUDA and NCCL under "
      "/usr/local/cuda), or use the CPU backend");
}

bool nccl_available() {
  return false;
}

}  // namespace ddprun::sdk
