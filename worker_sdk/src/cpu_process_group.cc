#include "cpu_process_group.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "ddprun/backends.h"
#include "fnv1a.h"
#include "rendezvous/store/store.h"
#include "rendezvous/store/store_error.h"

namespace ddprun::sdk {
namespace {

std::string advertise_address(const ProcessGroupOptions& options) {
  if (!options.advertise_address.empty()) return options.advertise_address;
  if (const char* master = std::getenv("MASTER_ADDR"); master && *master) {
    std::string local = local_address_towards(master);
    if (!local.empty()) return local;
  }
  return "127.0.0.1";
}

std::string describe_call(const char* op, size_t count, DType dtype) {
  return std::string(op) + "(" + dtype_name(dtype) + " x " + std::to_string(count) + ")";
}

}  // namespace

CpuProcessGroup::CpuProcessGroup(rdzv::Store& store, const std::string& prefix, int rank, int size,
                                 const ProcessGroupOptions& options)
    : ProcessGroup(rank, size), options_(options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("make_cpu_process_group: rank " + std::to_string(rank) +
                                " outside world size " + std::to_string(size));
  }
  Deadline deadline(options_.timeout);
  if (size == 1) {
    topo_.hosts = {{0}};
    topo_.host_of = {0};
    return;
  }
  try {
    bootstrap(store, prefix, deadline);
  } catch (const CollectiveError& e) {
    break_transports(e.peer());
    throw CollectiveError("cpu process group bootstrap on rank " + std::to_string(rank) + " failed after " +
                              deadline.elapsed_text() + ": " + e.what(),
                          e.peer());
  } catch (const std::exception& e) {
    break_transports(-1);
    throw CollectiveError("cpu process group bootstrap on rank " + std::to_string(rank) + " failed after " +
                              deadline.elapsed_text() + ": " + e.what(),
                          -1);
  }
}

CpuProcessGroup::~CpuProcessGroup() = default;

void CpuProcessGroup::bootstrap(rdzv::Store& store, const std::string& prefix, const Deadline& deadline) {
  listener_ = std::make_unique<TcpListener>();
  PeerInfo me;
  me.rank = rank();
  me.pid = static_cast<int>(::getpid());
  me.host_id = options_.host_id.empty() ? detect_host_id() : options_.host_id;
  if (options_.cpu_transport == CpuTransport::kTcp) me.host_id += "#rank" + std::to_string(rank());
  me.address = advertise_address(options_);
  me.port = listener_->port();
  store.set(prefix + "/peer/" + std::to_string(rank()), encode_peer(me));

  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(prefix + "/peer/" + std::to_string(r));
  try {
    store.wait(keys, deadline.remaining());
  } catch (const rdzv::TimeoutError&) {
    for (int r = 0; r < size(); ++r) {
      if (!store.check({keys[r]})) {
        throw CollectiveError("rank " + std::to_string(r) + " did not join (no " + keys[r] + " in the store)",
                              r);
      }
    }
    throw;
  }
  std::vector<std::string> records;
  try {
    records = store.multi_get(keys);
  } catch (const rdzv::InvalidArgumentError&) {  // a legacy (torch 1.13) store has no MULTI_GET
    for (const auto& k : keys) records.push_back(store.get(k));
  }
  std::vector<PeerInfo> peers;
  for (int r = 0; r < size(); ++r) peers.push_back(decode_peer(records[r], r));
  topo_ = Topology::build(peers, rank());
  multi_host_ = topo_.num_hosts() > 1;

  const auto& local = topo_.local_ranks();
  if (local.size() > 1) {
    shm_ = std::make_unique<ShmCollectives>(store, prefix + "/shm/" + std::to_string(local[0]), local,
                                            topo_.my_local, options_.shm_slot_bytes, abort_, deadline);
  }
  if (multi_host_ && topo_.is_leader()) {
    std::vector<TcpRing::Member> members;
    for (int h = 0; h < topo_.num_hosts(); ++h) {
      const PeerInfo& p = peers[topo_.leader_of(h)];
      members.push_back({p.rank, p.address, p.port});
    }
    ring_ = std::make_unique<TcpRing>(*listener_, std::move(members), topo_.my_host, fnv1a(prefix),
                                      options_.tcp_segment_bytes, abort_, deadline);
  }
  listener_.reset();
}

std::string CpuProcessGroup::describe() const {
  std::string out = "cpu: ";
  if (size() == 1) return out + "single rank";
  if (!multi_host_) return out + "shm(" + std::to_string(size()) + ")";
  bool one_per_host = static_cast<int>(topo_.hosts.size()) == size();
  if (one_per_host) return out + "tcp-ring(" + std::to_string(size()) + ")";
  return out + "shm(" + std::to_string(topo_.local_ranks().size()) + ") x tcp-ring(" +
         std::to_string(topo_.num_hosts()) + " hosts)";
}

void CpuProcessGroup::check_usable(const std::string& what) const {
  if (abort_.raised()) {
    throw CollectiveError(
        what + " on rank " + std::to_string(rank()) + ": the process group is aborted: " + abort_.reason(),
        abort_.peer());
  }
}

void CpuProcessGroup::break_transports(int blamed) {
  if (shm_) shm_->poison(blamed);
  if (ring_) ring_->shutdown();
}

template <class Body>
void CpuProcessGroup::guarded(const std::string& what, const Deadline& deadline, Body&& body) {
  check_usable(what);
  std::string detail;
  int peer = -1;
  try {
    body();
    return;
  } catch (const CollectiveError& e) {
    detail = e.what();
    peer = e.peer();
  } catch (const std::exception& e) {
    detail = e.what();
  }
  std::string msg = what + " on rank " + std::to_string(rank()) + " failed after " + deadline.elapsed_text() +
                    ": " + detail;
  if (abort_.raise(msg, peer)) break_transports(peer);
  throw CollectiveError(msg, peer);
}

void CpuProcessGroup::all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  if (count > 0 && data == nullptr) throw std::invalid_argument("all_reduce: null buffer");
  Deadline deadline(options_.timeout);
  const int divisor = op == ReduceOp::kAvg ? size() : 1;
  guarded(describe_call("all_reduce", count, dtype), deadline, [&] {
    if (size() == 1 || count == 0) return;
    if (!multi_host_) return shm_->all_reduce(data, count, dtype, op, divisor, true, deadline);
    if (!shm_) return ring_->all_reduce(data, count, dtype, op, divisor, deadline);
    shm_->all_reduce(data, count, dtype, op, 1, topo_.is_leader(), deadline);
    if (ring_) ring_->all_reduce(data, count, dtype, op, divisor, deadline);
    shm_->broadcast(data, count * dtype_size(dtype), 0, deadline);
  });
}

void CpuProcessGroup::broadcast(void* data, size_t count, DType dtype, int root) {
  if (root < 0 || root >= size()) {
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " outside world size " +
                                std::to_string(size()));
  }
  if (count > 0 && data == nullptr) throw std::invalid_argument("broadcast: null buffer");
  Deadline deadline(options_.timeout);
  guarded(describe_call("broadcast", count, dtype), deadline, [&] {
    const size_t bytes = count * dtype_size(dtype);
    if (size() == 1 || bytes == 0) return;
    const int root_host = topo_.host_of[root];
    const auto& root_ranks = topo_.hosts[root_host];
    const int root_local =
        static_cast<int>(std::find(root_ranks.begin(), root_ranks.end(), root) - root_ranks.begin());
    if (topo_.my_host == root_host && shm_) shm_->broadcast(data, bytes, root_local, deadline);
    if (ring_) ring_->broadcast(data, bytes, root_host, deadline);
    if (topo_.my_host != root_host && shm_) shm_->broadcast(data, bytes, 0, deadline);
  });
}

void CpuProcessGroup::all_gather(const void* in, void* out, size_t count, DType dtype) {
  if (count > 0 && (in == nullptr || out == nullptr)) throw std::invalid_argument("all_gather: null buffer");
  Deadline deadline(options_.timeout);
  guarded(describe_call("all_gather", count, dtype), deadline, [&] {
    const size_t bytes = count * dtype_size(dtype);
    if (bytes == 0) return;
    if (size() == 1) {
      if (in != out) std::memmove(out, in, bytes);
      return;
    }
    if (!multi_host_) return shm_->all_gather(in, out, bytes, deadline);
    const auto& local = topo_.local_ranks();
    std::vector<std::byte> host_block(local.size() * bytes);
    if (shm_) {
      shm_->all_gather(in, host_block.data(), bytes, deadline);
    } else {
      std::memcpy(host_block.data(), in, bytes);
    }
    if (ring_) {
      std::vector<size_t> offsets, lens;
      size_t off = 0;
      for (const auto& h : topo_.hosts) {
        offsets.push_back(off);
        lens.push_back(h.size() * bytes);
        off += h.size() * bytes;
      }
      std::vector<std::byte> all(off);
      std::memcpy(all.data() + offsets[topo_.my_host], host_block.data(), host_block.size());
      ring_->all_gatherv(all.data(), offsets, lens, deadline);
      auto* dst = static_cast<std::byte*>(out);
      for (size_t h = 0; h < topo_.hosts.size(); ++h) {
        for (size_t i = 0; i < topo_.hosts[h].size(); ++i) {
          std::memcpy(dst + topo_.hosts[h][i] * bytes, all.data() + offsets[h] + i * bytes, bytes);
        }
      }
    }
    if (shm_) shm_->broadcast(out, bytes * size(), 0, deadline);
  });
}

void CpuProcessGroup::barrier() {
  Deadline deadline(options_.timeout);
  guarded("barrier", deadline, [&] {
    if (size() == 1) return;
    if (shm_) shm_->barrier(deadline);
    if (ring_) ring_->barrier(deadline);
    if (shm_ && multi_host_) shm_->barrier(deadline);
  });
}

void CpuProcessGroup::abort() {
  if (abort_.raise("abort() was called on rank " + std::to_string(rank()), rank())) break_transports(rank());
}

std::unique_ptr<ProcessGroup> make_cpu_process_group(rdzv::Store& store, const std::string& prefix, int rank,
                                                     int size, const ProcessGroupOptions& options) {
  return std::make_unique<CpuProcessGroup>(store, prefix, rank, size, options);
}

}  // namespace ddprun::sdk
