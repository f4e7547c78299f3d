// EtcdRendezvous::State: torch's active_version as read (the reply and its JSON). Private to
// etcd_rendezvous.cc and etcd_round.cc; read_state() validates the fields before any of these accessors is
// used.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "rendezvous/etcd/etcd_rendezvous.h"

namespace ddprun::rdzv::etcd {

struct EtcdRendezvous::State {
  Response r;
  nlohmann::json j;
  std::string status() const { return j.at("status").get<std::string>(); }
  std::string version() const { return j.contains("version") ? j.at("version").get<std::string>() : ""; }
  uint64_t index() const { return r.etcd_index; }
};

}  // namespace ddprun::rdzv::etcd
