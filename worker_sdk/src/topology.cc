#include "topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>

#include "rendezvous/util/text_util.h"

namespace ddprun::sdk {
namespace {

template <class T>
T parse_number(std::string_view s, int rank, const char* what) {
  const auto v = parse_int_in<T>(s, std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
  if (!v) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " published a bad " + what + ": '" +
                                std::string(s) + "'");
  }
  return *v;
}

}  // namespace

std::string encode_peer(const PeerInfo& p) {
  return std::to_string(p.pid) + "\t" + p.address + "\t" + std::to_string(p.port) + "\t" + p.host_id;
}

PeerInfo decode_peer(std::string_view text, int rank) {
  std::vector<std::string_view> f;
  size_t start = 0;
  for (int i = 0; i < 3; ++i) {
    size_t tab = text.find('\t', start);
    if (tab == std::string_view::npos) {
      throw std::invalid_argument("rank " + std::to_string(rank) + " published a malformed record: '" +
                                  std::string(text) + "'");
    }
    f.push_back(text.substr(start, tab - start));
    start = tab + 1;
  }
  PeerInfo p;
  p.rank = rank;
  p.pid = parse_number<int>(f[0], rank, "pid");
  p.address = std::string(f[1]);
  p.port = parse_number<uint16_t>(f[2], rank, "port");
  p.host_id = std::string(text.substr(start));
  return p;
}

Topology Topology::build(const std::vector<PeerInfo>& peers, int my_rank) {
  Topology t;
  std::map<std::string, int> host_index;
  t.host_of.resize(peers.size());
  for (size_t r = 0; r < peers.size(); ++r) {
    auto [it, fresh] = host_index.emplace(peers[r].host_id, static_cast<int>(t.hosts.size()));
    if (fresh) t.hosts.emplace_back();
    t.hosts[it->second].push_back(static_cast<int>(r));
    t.host_of[r] = it->second;
  }
  t.my_host = t.host_of.at(my_rank);
  const auto& mine = t.hosts[t.my_host];
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i] == my_rank) t.my_local = static_cast<int>(i);
  }
  return t;
}

std::string detect_host_id() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  struct stat st {};
  unsigned long long pidns = ::stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
  return std::string(host) + "/" + boot_id + "/" + std::to_string(pidns);
}

}  // namespace ddprun::sdk
