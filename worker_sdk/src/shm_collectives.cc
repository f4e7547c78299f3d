#include "shm_collectives.h"

#include <sched.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include "fnv1a.h"
#include "reduce_kernels.h"
#include "rendezvous/store/store.h"
#include "rendezvous/store/store_error.h"

namespace ddprun::sdk {
namespace {

constexpr int kSpins = 256;
constexpr int kYields = 64;
constexpr long kMaxSleepNs = 50'000;
constexpr auto kPidCheckEvery = std::chrono::milliseconds(10);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Buffers at least this large are copied out with streaming stores: the result does not stay in (and evict)
// the cache, and the destination lines are not read first.
constexpr size_t kStreamingBytes = size_t{4} << 20;

// memcpy with non-temporal stores where available.
void copy_streaming(std::byte* dst, const std::byte* src, size_t n) {
#if defined(__x86_64__)
  size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  head = std::min(head, n);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

void copy_cached(std::byte* dst, const std::byte* src, size_t n) {
  std::memcpy(dst, src, n);
}

std::string segment_name(const std::string& key) {
  static std::atomic<unsigned> serial{0};
  char buf[96];
  std::snprintf(buf, sizeof buf, "/ddprun-%016llx-%d-%u", static_cast<unsigned long long>(fnv1a(key)),
                static_cast<int>(::getpid()), serial.fetch_add(1));
  return buf;
}

}  // namespace

bool process_alive(int pid) {
  if (pid <= 0) return true;  // not published yet: nothing to say
  if (::kill(pid, 0) != 0) return errno == EPERM;
  // A killed child stays a zombie until its parent (the agent) reaps it.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

ShmCollectives::ShmCollectives(rdzv::Store& store, const std::string& key, std::vector<int> ranks, int me,
                               size_t slot_bytes, AbortSignal& abort, const Deadline& deadline)
    : ranks_(std::move(ranks)),
      n_(static_cast<int>(ranks_.size())),
      me_(me),
      abort_(abort),
      layout_(n_, slot_bytes) {
  srcs_.assign(static_cast<size_t>(n_), nullptr);
  cpu_set_t cpus;
  if (::sched_getaffinity(0, sizeof cpus, &cpus) == 0) oversubscribed_ = n_ > CPU_COUNT(&cpus);
  if (me_ == 0) {
    std::string name = segment_name(key);
    segment_ = ShmSegment::create(name, layout_.total_bytes);
    auto& h = *new (segment_->base()) ShmLayout::Header{};
    h.magic = ShmLayout::kMagic;
    h.total_bytes = layout_.total_bytes;
    h.slot_bytes = layout_.slot_bytes;
    h.nranks = static_cast<uint32_t>(n_);
    for (int i = 0; i < n_; ++i) {
      new (&pid(i)) std::atomic<int32_t>(0);
      new (&sync(i)) ShmLayout::RankSync{};
    }
    pid(0).store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
    h.attached.store(1, std::memory_order_release);
    store.set(key, name);
    wait_attached(deadline);
    segment_->unlink();
    return;
  }
  std::string name;
  try {
    store.wait({key}, deadline.remaining());
    name = store.get(key);
  } catch (const rdzv::StoreError& e) {
    throw CollectiveError(
        "rank " + std::to_string(ranks_[0]) + " did not publish the shared memory segment (" + e.what() + ")",
        ranks_[0]);
  }
  segment_ = ShmSegment::attach(name);
  auto& h = header();
  if (segment_->size() < sizeof(ShmLayout::Header) || h.magic != ShmLayout::kMagic ||
      h.nranks != static_cast<uint32_t>(n_) || h.slot_bytes != layout_.slot_bytes ||
      h.total_bytes != layout_.total_bytes || segment_->size() != layout_.total_bytes) {
    throw CollectiveError("shared memory segment " + name + " does not match this group (" +
                              std::to_string(n_) + " local ranks, " + std::to_string(layout_.slot_bytes) +
                              "-byte slots): are the ranks' options different?",
                          ranks_[0]);
  }
  pid(me_).store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
  h.attached.fetch_add(1, std::memory_order_acq_rel);
}

ShmCollectives::~ShmCollectives() = default;

ShmLayout::Header& ShmCollectives::header() const {
  return *reinterpret_cast<ShmLayout::Header*>(segment_->base());
}
ShmLayout::RankSync& ShmCollectives::sync(int i) const {
  return *reinterpret_cast<ShmLayout::RankSync*>(segment_->base() + layout_.sync_off +
                                                 sizeof(ShmLayout::RankSync) * i);
}
std::atomic<int32_t>& ShmCollectives::pid(int i) const {
  return *reinterpret_cast<std::atomic<int32_t>*>(segment_->base() + layout_.pids_off + sizeof(int32_t) * i);
}
std::byte* ShmCollectives::small_slot(int parity, int i) const {
  return segment_->base() + layout_.small_off + ShmLayout::kSmallBytes * (parity * n_ + i);
}
std::byte* ShmCollectives::slot(int set, int i) const {
  return segment_->base() + layout_.slot_off(set, i);
}
std::byte* ShmCollectives::result(int set) const {
  return segment_->base() + layout_.result_off(set);
}
std::byte* ShmCollectives::bcast(int parity) const {
  return segment_->base() + layout_.bcast_off + layout_.bcast_bytes * parity;
}

void ShmCollectives::poison(int blamed) {
  uint64_t word = (static_cast<uint64_t>(ranks_[me_] + 1) << 32) | static_cast<uint32_t>(blamed + 1);
  uint64_t expected = 0;
  header().abort_word.compare_exchange_strong(expected, word, std::memory_order_acq_rel);
}

// ---- waiting --------------------------------------------------------------------------------------------

void ShmCollectives::arrive() {
  sync(me_).epoch.store(++epoch_, std::memory_order_release);
}

int ShmCollectives::behind(std::atomic<uint64_t> ShmLayout::RankSync::*field, uint64_t target) const {
  for (int i = 0; i < n_; ++i) {
    if ((sync(i).*field).load(std::memory_order_acquire) < target) return i;
  }
  return -1;
}

void ShmCollectives::check_failures(int blamed_local, bool check_pids) {
  abort_.throw_if_raised();
  uint64_t word = header().abort_word.load(std::memory_order_acquire);
  if (word != 0) {
    int reporter = static_cast<int>(word >> 32) - 1;
    int blamed = static_cast<int>(word & 0xFFFFFFFFu) - 1;
    throw CollectiveError("rank " + std::to_string(reporter) + " broke the group" +
                              (blamed >= 0 ? " (it reported rank " + std::to_string(blamed) + ")" : ""),
                          blamed >= 0 ? blamed : reporter);
  }
  if (!check_pids) return;
  // Every peer, not only the one waited for: a dead rank stalls the group wherever it is.
  for (int k = 0; k < n_; ++k) {
    const int i = (blamed_local + k + n_) % n_;  // the one waited for first
    if (i == me_) continue;
    int p = pid(i).load(std::memory_order_relaxed);
    if (!process_alive(p)) {
      poison(ranks_[i]);
      throw CollectiveError(
          "rank " + std::to_string(ranks_[i]) + " (pid " + std::to_string(p) + ") exited (shared memory)",
          ranks_[i]);
    }
  }
}

template <class Ready, class Blame>
void ShmCollectives::wait_until(Ready&& ready, Blame&& blame, const Deadline& deadline) {
  if (!oversubscribed_) {
    for (int i = 0; i < kSpins; ++i) {
      if (ready()) return;
      cpu_relax();
    }
  }
  for (int i = 0; i < kYields; ++i) {
    if (ready()) return;
    check_failures(std::max(blame(), 0), false);
    ::sched_yield();
  }
  long sleep_ns = 1000;
  auto next_pid_check = Clock::now();
  for (;;) {
    if (ready()) return;
    auto now = Clock::now();
    bool check_pids = now >= next_pid_check;
    if (check_pids) next_pid_check = now + kPidCheckEvery;
    int missing = blame();
    check_failures(std::max(missing, 0), check_pids);
    if (now >= deadline.end()) {
      if (ready()) return;
      const int r = ranks_[std::max(missing, 0)];
      throw CollectiveError("timed out waiting for rank " + std::to_string(r) + " (shared memory)", r);
    }
    if (oversubscribed_) {
      ::sched_yield();  // a peer waiting for a CPU is the likely reason we wait
    }
    timespec ts{0, sleep_ns};
    ::nanosleep(&ts, nullptr);
    sleep_ns = std::min(sleep_ns * 2, kMaxSleepNs);
  }
}

void ShmCollectives::wait_for(int only, uint64_t target, const Deadline& deadline,
                              std::atomic<uint64_t> ShmLayout::RankSync::*field) {
  if (only >= 0) {
    wait_until([&] { return (sync(only).*field).load(std::memory_order_acquire) >= target; },
               [&] { return only; }, deadline);
  } else {
    wait_until([&] { return behind(field, target) < 0; }, [&] { return behind(field, target); }, deadline);
  }
}

void ShmCollectives::wait_attached(const Deadline& deadline) {
  long sleep_ns = 1000;
  auto& h = header();
  while (h.attached.load(std::memory_order_acquire) < static_cast<uint32_t>(n_)) {
    abort_.throw_if_raised();
    if (deadline.expired()) {
      int missing = 1;
      while (missing < n_ - 1 && pid(missing).load(std::memory_order_relaxed) != 0) ++missing;
      throw CollectiveError("timed out waiting for rank " + std::to_string(ranks_[missing]) +
                                " to attach the shared memory segment",
                            ranks_[missing]);
    }
    timespec ts{0, sleep_ns};
    ::nanosleep(&ts, nullptr);
    sleep_ns = std::min(sleep_ns * 2, kMaxSleepNs * 20);
  }
}

// ---- collectives ----------------------------------------------------------------------------------------

void ShmCollectives::all_reduce(void* data, size_t count, DType dtype, ReduceOp op, int divisor,
                                bool copy_out, const Deadline& deadline) {
  const size_t es = dtype_size(dtype);
  const size_t bytes = count * es;
  if (bytes == 0) return;
  auto* buf = static_cast<std::byte*>(data);
  std::vector<const void*>& srcs = srcs_;

  if (bytes <= ShmLayout::kSmallBytes) {
    const int p = small_parity_;
    small_parity_ ^= 1;
    std::memcpy(small_slot(p, me_), buf, bytes);
    arrive();
    wait_for(-1, epoch_, deadline);
    for (int k = 0; k < n_; ++k) srcs[k] = small_slot(p, k);
    reduce_sources(buf, srcs.data(), n_, count, dtype, op, divisor);
    return;
  }

  large_all_reduce(buf, count, dtype, op, divisor, copy_out, deadline);
}

void ShmCollectives::large_all_reduce(std::byte* buf, size_t count, DType dtype, ReduceOp op, int divisor,
                                      bool copy_out, const Deadline& deadline) {
  using RS = ShmLayout::RankSync;
  constexpr uint64_t kSets = ShmLayout::kSets;
  const size_t es = dtype_size(dtype);
  const size_t chunk_elems = layout_.slot_bytes / es;
  const uint64_t first = chunks_, end = chunks_ + (count + chunk_elems - 1) / chunk_elems;
  const size_t line = std::max<size_t>(1, 64 / es);  // elements per cache line
  const bool streaming = count * es >= kStreamingBytes;
  auto chunk_len = [&](uint64_t c) { return std::min(chunk_elems, count - (c - first) * chunk_elems); };
  // My part [lo, hi) of a chunk of m elements: 1/n of it, in whole cache lines.
  auto part = [&](size_t m) {
    const size_t per = ((m + n_ - 1) / n_ + line - 1) / line * line;
    return std::pair{std::min(m, per * me_), std::min(m, per * me_ + per)};
  };
  auto data_of = [&](uint64_t c) { return buf + (c - first) * chunk_elems * es; };
  // min over ranks of a counter, read fresh
  auto all_at_least = [&](std::atomic<uint64_t> RS::*field, uint64_t v) { return behind(field, v) < 0; };

  RS& mine = sync(me_);
  uint64_t in = first, red = first, out = first;
  auto can_reduce = [&] { return red < in && all_at_least(&RS::in_done, red + 1); };
  auto can_copy_in = [&] { return in < end && (in < kSets || all_at_least(&RS::out_done, in + 1 - kSets)); };
  auto can_copy_out = [&] { return out < red && all_at_least(&RS::red_done, out + 1); };
  std::vector<const void*>& srcs = srcs_;
  while (out < end) {
    if (can_reduce()) {
      // My part never goes through my slot: it is reduced in place in my buffer (one of the sources), then
      // published in the result area for the others.
      const int set = static_cast<int>(red % kSets);
      const auto [lo, hi] = part(chunk_len(red));
      if (hi > lo) {
        for (int k = 0; k < n_; ++k) srcs[k] = k == me_ ? data_of(red) + lo * es : slot(set, k) + lo * es;
        reduce_sources(data_of(red) + lo * es, srcs.data(), n_, hi - lo, dtype, op, divisor);
        std::memcpy(result(set) + lo * es, data_of(red) + lo * es, (hi - lo) * es);
      }
      mine.red_done.store(++red, std::memory_order_release);
    } else if (can_copy_in()) {
      const auto [lo, hi] = part(chunk_len(in));
      std::byte* my_slot = slot(static_cast<int>(in % kSets), me_);
      std::memcpy(my_slot, data_of(in), lo * es);
      std::memcpy(my_slot + hi * es, data_of(in) + hi * es, (chunk_len(in) - hi) * es);
      mine.in_done.store(++in, std::memory_order_release);
    } else if (can_copy_out()) {
      if (copy_out) {
        const auto [lo, hi] = part(chunk_len(out));
        const std::byte* res = result(static_cast<int>(out % kSets));
        auto copy = streaming ? copy_streaming : copy_cached;
        copy(data_of(out), res, lo * es);
        copy(data_of(out) + hi * es, res + hi * es, (chunk_len(out) - hi) * es);
      }
      mine.out_done.store(++out, std::memory_order_release);
    } else {
      // Nothing ready: wait for any step to become ready; a timeout blames the earliest step's laggard.
      auto blame = [&]() -> int {
        if (red < in) return behind(&RS::in_done, red + 1);
        if (out < red) return behind(&RS::red_done, out + 1);
        return behind(&RS::out_done, in + 1 - kSets);
      };
      wait_until([&] { return can_reduce() || can_copy_in() || can_copy_out(); }, blame, deadline);
    }
  }
  chunks_ = end;
}

void ShmCollectives::broadcast(void* data, size_t bytes, int root, const Deadline& deadline) {
  auto* buf = static_cast<std::byte*>(data);
  for (size_t off = 0; off < bytes; off += layout_.bcast_bytes) {
    const size_t len = std::min(layout_.bcast_bytes, bytes - off);
    const int p = bcast_parity_;
    bcast_parity_ ^= 1;
    if (me_ == root) {
      // The half written now was last read two broadcast chunks ago: every rank must be past that step.
      if (epoch_ >= 1) wait_for(-1, epoch_ - 1, deadline);
      std::memcpy(bcast(p), buf + off, len);
      arrive();
    } else {
      wait_for(root, epoch_ + 1, deadline);
      std::memcpy(buf + off, bcast(p), len);
      arrive();
    }
  }
}

void ShmCollectives::all_gather(const void* in, void* out, size_t bytes, const Deadline& deadline) {
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  // The slots of set 0 are free once every rank has copied out every large all-reduce chunk.
  wait_for(-1, chunks_, deadline, &ShmLayout::RankSync::out_done);
  for (size_t off = 0; off < bytes; off += layout_.slot_bytes) {
    const size_t len = std::min(layout_.slot_bytes, bytes - off);
    std::memcpy(slot(0, me_), src + off, len);
    arrive();
    wait_for(-1, epoch_, deadline);
    for (int k = 0; k < n_; ++k) std::memcpy(dst + k * bytes + off, slot(0, k), len);
    arrive();
    wait_for(-1, epoch_, deadline);
  }
}

void ShmCollectives::barrier(const Deadline& deadline) {
  arrive();
  wait_for(-1, epoch_, deadline);
}

}  // namespace ddprun::sdk
