// CRC-32C (Castagnoli, as iSCSI and ext4 use it) of the training state's copies between agents: the sending
// agent computes it while it reads the committed version, the receiving one while it writes, and commits the
// copy only when both agree (agent/state/state_transfer.h). SSE4.2's crc32 instruction where the CPU has it
// (several GB/s), a table otherwise.
//
// Pure; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddprun::agent {

// The CRC-32C of `n` bytes at `data` continuing from `crc` (0 for a start): crc32c(crc32c(0, a), b) is the
// CRC of a then b. crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace ddprun::agent
