// Topology of a CPU process group: who each rank is (PeerInfo, as published in the store) and which ranks
// share a host. Pure logic except detect_host_id(), which reads the system.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::sdk {

struct PeerInfo {
  int rank = -1;
  int pid = 0;
  std::string host_id;  // equal ids = same host (shared memory possible)
  std::string address;  // where the rank's TCP listener is reached
  uint16_t port = 0;
};

// One line, tab-separated: "pid\taddress\tport\thost_id". decode throws std::invalid_argument naming the
// rank on malformed input.
std::string encode_peer(const PeerInfo& p);
PeerInfo decode_peer(std::string_view text, int rank);

struct Topology {
  std::vector<std::vector<int>> hosts;  // global ranks of each host, ascending; hosts ordered by first rank
  std::vector<int> host_of;             // host index of each rank
  int my_host = 0;
  int my_local = 0;  // my index in hosts[my_host]

  // peers[r].rank == r for every r; my_rank in range.
  static Topology build(const std::vector<PeerInfo>& peers, int my_rank);
  int num_hosts() const { return static_cast<int>(hosts.size()); }
  const std::vector<int>& local_ranks() const { return hosts[my_host]; }
  int leader_of(int host) const { return hosts[host][0]; }
  bool is_leader() const { return my_local == 0; }
};

// "<hostname>/<boot_id>/<pid namespace inode>": equal exactly when two processes can share POSIX shared
// memory and see each other's pids.
std::string detect_host_id();

}  // namespace ddprun::sdk
