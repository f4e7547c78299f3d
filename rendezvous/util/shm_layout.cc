#include "rendezvous/util/shm_layout.h"

#include "rendezvous/util/text_util.h"

namespace ddprun {

std::optional<size_t> shm_slot_bytes(std::string_view text) {
  if (text.empty()) return kDefaultShmSlotBytes;
  return parse_int_in<size_t>(text, kMinShmSlotBytes, kMaxShmSlotBytes);
}

namespace {

size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

}  // namespace

ShmLayout::ShmLayout(int n, size_t slot) : nranks(n) {
  slot_bytes = align_up(slot < 8192 ? 8192 : slot, 4096);
  bcast_bytes = 4 * slot_bytes;
  constexpr size_t kPage = 4096, kLine = 64;
  pids_off = align_up(sizeof(Header), kLine);
  sync_off = align_up(pids_off + sizeof(int32_t) * n, kLine);
  small_off = align_up(sync_off + sizeof(RankSync) * n, kPage);
  sets_off = small_off + 2 * kSmallBytes * n;
  bcast_off = sets_off + kSets * (n + 1) * slot_bytes;
  total_bytes = bcast_off + 2 * bcast_bytes;
}

}  // namespace ddprun
