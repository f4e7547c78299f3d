// torch's etcd rendezvous, phase by phase (etcd_rendezvous.py: init_phase, join_phase, confirm_phase, ...).
// The round's store and the watcher: etcd_round.cc.
#include "rendezvous/etcd/etcd_rendezvous.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "rendezvous/etcd/etcd_state.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/etcd/lease_keeper.h"
#include "rendezvous/util/backoff.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv::etcd {

using json = nlohmann::json;
using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::seconds;

namespace {

// torch's TTLs (etcd_rendezvous.py CONST_*), in seconds.
constexpr int64_t kSetupTtl = 5;
constexpr int64_t kFrozenTtl = 10;
constexpr int64_t kJoinableEphemeralTtl = 10;
constexpr int64_t kKeepAliveTtl = 10;
constexpr int64_t kRunIdSubrootTtl = 7200;

// torch's EtcdRendezvousRetryImmediately / EtcdRendezvousRetryableFailure.
struct RetryNow {};
struct RetryLater {};

bool code_is(const EtcdKeyError& e, int code) {
  return e.code() == code;
}

}  // namespace

EtcdRendezvous::EtcdRendezvous(EtcdRendezvousOptions options)
    : options_(std::move(options)),
      client_(std::make_shared<Client>(options_.client)),
      watcher_client_(std::make_shared<Client>(options_.client)) {
  if (options_.prefix.empty() || options_.prefix.back() != '/') options_.prefix += '/';
  if (options_.prefix.front() != '/') options_.prefix.insert(options_.prefix.begin(), '/');
  try {
    if (options_.prefix != "/") create_dir(options_.prefix, std::nullopt);
    create_dir(path(""), kRunIdSubrootTtl);
    leases_ = std::make_unique<LeaseKeeper>(std::make_unique<Client>(options_.client));
    leases_->add(path(""), seconds(kRunIdSubrootTtl), true);
    create_dir(path("/rdzv"), std::nullopt);
    try {
      client_->write(path("/rdzv/version_counter"), "0", {.prev_exist = false});
    } catch (const EtcdKeyError& e) {
      if (!code_is(e, kNodeExist)) throw;
    }
  } catch (const StoreError& e) {
    throw store_failure(e);
  }
  spdlog::info("rendezvous {}: etcd at {}, keys under {}", options_.run_id, client_->endpoints_text(),
               path(""));
}

EtcdRendezvous::~EtcdRendezvous() = default;

std::string EtcdRendezvous::path(const std::string& p) const {
  return options_.prefix + "run_" + options_.run_id + (p.empty() || p.front() == '/' ? p : "/" + p);
}

RendezvousStoreError EtcdRendezvous::store_failure(const StoreError& e) const {
  std::string text = e.what();
  if (text.find(client_->current_endpoint()) == std::string::npos)
    text = "etcd at " + client_->endpoints_text() + ": " + text;
  return RendezvousStoreError("rendezvous '" + run_id() + "': " + text);
}

RendezvousStoreError EtcdRendezvous::foreign(const std::string& key, const std::string& value,
                                             const std::string& why) const {
  return RendezvousStoreError("rendezvous '" + run_id() + "': etcd key " + key + " at " +
                              client_->current_endpoint() + " holds '" + printable(value) + "', " + why +
                              "; does another program use --rdzv_id " + run_id() + " under etcd_prefix " +
                              options_.prefix + "?");
}

void EtcdRendezvous::create_dir(const std::string& full_path, std::optional<int64_t> ttl) {
  try {
    client_->write(full_path, "", {.prev_exist = false, .ttl = ttl, .dir = true});
  } catch (const EtcdKeyError& e) {
    if (!code_is(e, kNodeExist)) throw;
  }
}

EtcdRendezvous::State EtcdRendezvous::read_state(Client& client) const {
  const std::string key = path("/rdzv/active_version");
  State s{client.get(key), {}};
  s.j = json::parse(s.r.node.value, nullptr, false);
  const bool ok = s.j.is_object() && s.j.contains("status") && s.j["status"].is_string() &&
                  (!s.j.contains("version") || s.j["version"].is_string());
  if (!ok) throw foreign(key, s.r.node.value, "not the JSON state torch's etcd rendezvous writes");
  const std::string st = s.status();
  if (st == "joinable" || st == "frozen" || st == "final") {
    const bool lists =
        s.j.contains("version") && s.j.contains("participants") && s.j["participants"].is_array() &&
        (st == "joinable" || (s.j.contains("keep_alives") && s.j["keep_alives"].is_array())) &&
        (st != "final" ||
         (s.j.contains("num_workers_waiting") && s.j["num_workers_waiting"].is_number_integer()));
    if (!lists) throw foreign(key, s.r.node.value, "a '" + st + "' state without its fields");
  } else if (st != "setup" && st != "closed") {
    throw foreign(key, s.r.node.value, "an unknown status '" + st + "'");
  }
  return s;
}

std::optional<Response> EtcdRendezvous::update_state(const ChangeFn& change, IfGone if_gone) {
  while (true) {
    State s;
    try {
      s = read_state(*client_);
    } catch (const EtcdKeyError& e) {
      if (if_gone == IfGone::kThrow || !code_is(e, kKeyNotFound)) throw;
      return std::nullopt;
    }
    const std::optional<Change> next = change(s);
    if (!next) return std::nullopt;
    try {
      return client_->write(path("/rdzv/active_version"), next->value,
                            {.prev_value = s.r.node.value, .ttl = next->ttl});
    } catch (const EtcdKeyError& e) {
      if (!code_is(e, kTestFailed)) throw;
    }
    retry_backoff();
  }
}

bool EtcdRendezvous::watch_in_time(const std::string& key, bool recursive, uint64_t index,
                                   std::optional<milliseconds> timeout) {
  auto overall = duration_cast<milliseconds>(deadline_ - Clock::now()) + seconds(1);
  const milliseconds t = std::max(milliseconds(1), timeout ? std::min(*timeout, overall) : overall);
  try {
    client_->watch(key, index, recursive, t);
  } catch (const EtcdKeyError& e) {
    if (!code_is(e, kEventIndexCleared)) throw;
  }
  return Clock::now() <= deadline_;
}

EtcdRendezvous::State EtcdRendezvous::wait_for_change(uint64_t index) {
  if (!watch_in_time(path("/rdzv/active_version"), false, index, std::nullopt)) throw join_timed_out();
  return read_state(*client_);
}

RendezvousTimeoutError EtcdRendezvous::join_timed_out() const {
  return RendezvousTimeoutError(
      "rendezvous '" + run_id() + "': fewer than " + std::to_string(options_.min_nodes) +
      " nodes joined within the join timeout (etcd at " + client_->endpoints_text() + ")");
}

RendezvousInfo EtcdRendezvous::do_next_rendezvous(int local_world_size) {
  deadline_ = Clock::now() + options_.join_timeout;
  // The previous round's keep-alive: deleted rather than left to expire, so that the round is destroyed now.
  if (!keep_alive_key_.empty()) {
    leases_->remove(keep_alive_key_);
    try {
      client_->remove(keep_alive_key_);
    } catch (const EtcdKeyError&) {  // expired already
    }
    keep_alive_key_.clear();
  }
  const Joined joined = barrier();
  return share_round(joined, local_world_size);
}

EtcdRendezvous::Joined EtcdRendezvous::barrier() {
  while (true) {
    if (Clock::now() > deadline_) throw join_timed_out();
    try {
      return init_phase();
    } catch (const RetryNow&) {
    } catch (const RetryLater&) {
      std::this_thread::sleep_for(milliseconds(100));
    } catch (const EtcdKeyError& e) {
      // A key of the state expired between two requests (torch: "attempt failed, will retry").
      if (!code_is(e, kKeyNotFound) && !code_is(e, kTestFailed) && !code_is(e, kNodeExist)) throw;
      spdlog::debug("rendezvous {}: attempt failed, retrying: {}", run_id(), e.what());
    }
  }
}

EtcdRendezvous::Joined EtcdRendezvous::init_phase() {
  State state;
  try {
    Response created = try_create();
    state = State{created, json::parse(created.node.value)};
  } catch (const EtcdKeyError& e) {
    if (!code_is(e, kNodeExist)) throw;
    state = read_state(*client_);
  }
  const std::string st = state.status();
  if (st == "closed") {
    throw RendezvousClosedError("rendezvous '" + run_id() + "' on etcd at " + client_->endpoints_text() +
                                " is closed: the job already finished; start a new job with a new --rdzv_id");
  }
  if (st == "joinable") return join_phase(state.version());
  if (st == "final") {
    handle_existing(state.version());
    throw RetryNow{};
  }
  wait_for_change(state.index() + 1);
  throw RetryLater{};
}

Response EtcdRendezvous::try_create() {
  const std::string active = path("/rdzv/active_version");
  Response setup = client_->write(active, R"({"status": "setup"})", {.prev_exist = false, .ttl = kSetupTtl});
  const std::string counter_key = path("/rdzv/version_counter");
  std::string next;
  try {
    Node counter = client_->get(counter_key).node;
    auto n = parse_int(counter.value);
    if (!n || *n < 0) throw foreign(counter_key, counter.value, "not a version counter");
    next = std::to_string(*n + 1);
    client_->write(counter_key, next, {.prev_value = counter.value});
  } catch (const EtcdKeyError& e) {
    if (!code_is(e, kKeyNotFound) && !code_is(e, kTestFailed)) throw;
    throw RendezvousStoreError("rendezvous '" + run_id() + "': unexpected state of etcd key " + counter_key +
                               " (" + e.what() + "); torch's agents die here too: start the job again");
  }
  client_->write(path("/rdzv/v_" + next), "", {.prev_exist = false, .dir = true});
  json joinable = {{"status", "joinable"}, {"version", next}, {"participants", json::array()}};
  return client_->write(active, joinable.dump(), {.prev_value = setup.node.value});
}

EtcdRendezvous::Joined EtcdRendezvous::join_phase(const std::string& version) {
  auto [active, rank] = join(version);
  json state = json::parse(active.node.value);
  spdlog::info("rendezvous {}: joined etcd rendezvous version {} as node {}", run_id(), version, rank);
  if (rank == options_.min_nodes - 1 && state["status"] == "joinable") {
    last_call(version, Clock::now() + options_.last_call_timeout);
  }
  wait_for_peers(version);
  return confirm_phase(version, rank);
}

std::pair<Response, int> EtcdRendezvous::join(const std::string& version) {
  int rank = 0;
  const auto joined = update_state([&](const State& s) -> std::optional<Change> {
    if (s.status() != "joinable") throw RetryLater{};
    if (s.version() != version) throw RetryNow{};
    json state = s.j;
    rank = static_cast<int>(state["participants"].size());
    if (rank >= options_.max_nodes) {
      throw foreign(path("/rdzv/active_version"), s.r.node.value,
                    "a joinable state with more participants than --nnodes' maximum " +
                        std::to_string(options_.max_nodes) +
                        " (are the nodes of this job started with different --nnodes?)");
    }
    state["participants"].push_back(rank);
    std::optional<int64_t> ttl;
    if (static_cast<int>(state["participants"].size()) == options_.max_nodes) {
      state["status"] = "frozen";
      state["keep_alives"] = json::array();
      ttl = kFrozenTtl;
    } else if (static_cast<int>(state["participants"].size()) >= options_.min_nodes) {
      ttl = kJoinableEphemeralTtl;
    }
    return Change{state.dump(), ttl};
  });
  return {*joined, rank};
}

Response EtcdRendezvous::wait_for_peers(const std::string& version) {
  State s = read_state(*client_);
  while (true) {
    if (s.status() == "frozen" && s.version() == version) return s.r;
    if (s.status() != "joinable" || s.version() != version) throw RetryLater{};
    s = wait_for_change(s.index() + 1);
  }
}

EtcdRendezvous::Joined EtcdRendezvous::confirm_phase(const std::string& version, int rank) {
  confirm_membership(version, rank);
  State s{wait_for_final(version), {}};
  s.j = json::parse(s.r.node.value);
  const int nodes = static_cast<int>(s.j["participants"].size());
  spdlog::info("rendezvous {}: etcd rendezvous version {} complete: node {} of {}", run_id(), version, rank,
               nodes);
  return Joined{version, rank, nodes};
}

void EtcdRendezvous::confirm_membership(const std::string& version, int rank) {
  const std::string lease_key = path("/rdzv/v_" + version + "/rank_" + std::to_string(rank));
  update_state([&](const State& s) -> std::optional<Change> {
    if (s.status() != "frozen" || s.version() != version) throw RetryNow{};
    client_->write(lease_key, "", {.ttl = kKeepAliveTtl});  // again after a lost race, as torch does
    json state = s.j;
    state["keep_alives"].push_back(lease_key);
    if (state["keep_alives"].size() != state["participants"].size()) return Change{state.dump(), kFrozenTtl};
    state["status"] = "final";
    state["num_workers_waiting"] = 0;
    return Change{state.dump(), std::nullopt};
  });
  keep_alive_key_ = lease_key;
  leases_->add(lease_key, seconds(kKeepAliveTtl), false);
}

Response EtcdRendezvous::wait_for_final(const std::string& version) {
  State s = read_state(*client_);
  while (true) {
    if (s.status() == "final" && s.version() == version) return s.r;
    if (s.status() != "frozen" || s.version() != version) throw RetryLater{};
    s = wait_for_change(s.index() + 1);
  }
}

void EtcdRendezvous::handle_existing(const std::string& version) {
  announce_waiting(version);
  spdlog::info("rendezvous {}: etcd rendezvous version {} is running; waiting for its next round", run_id(),
               version);
  wait_to_free(version);
}

void EtcdRendezvous::announce_waiting(const std::string& version) {
  update_state([&](const State& s) -> std::optional<Change> {
    if (s.status() != "final" || s.version() != version) throw RetryNow{};
    json state = s.j;
    state["num_workers_waiting"] = state["num_workers_waiting"].get<int64_t>() + 1;
    return Change{state.dump(), std::nullopt};
  });
}

void EtcdRendezvous::wait_to_free(const std::string& version) {
  State s = read_state(*client_);
  while (true) {
    if (s.status() != "final" || s.version() != version) return;
    Response alive = client_->get(path("/rdzv/v_" + version));
    for (const auto& key : s.j["keep_alives"]) {
      const std::string k = key.is_string() ? key.get<std::string>() : "";
      bool present = false;
      for (const Node& n : alive.node.nodes) present = present || n.key == k;
      if (present) continue;
      spdlog::info("rendezvous {}: keep-alive {} is gone: destroying etcd rendezvous version {}", run_id(), k,
                   version);
      try {
        client_->remove(path("/rdzv/active_version"), {.prev_value = s.r.node.value});
      } catch (const EtcdKeyError& e) {
        if (!code_is(e, kTestFailed) && !code_is(e, kKeyNotFound)) throw;  // somebody else did it
      }
      return;
    }
    if (!watch_in_time(path("/rdzv"), true, s.index() + 1, std::nullopt)) {
      throw RendezvousTimeoutError(
          "rendezvous '" + run_id() + "': the running round (etcd version " + version +
          ") did not end within the join timeout; this node waited to join the next one");
    }
    s = read_state(*client_);
  }
}

void EtcdRendezvous::last_call(const std::string& version, Clock::time_point deadline) {
  while (true) {
    bool freeze = false;
    const auto written = update_state([&](const State& s) -> std::optional<Change> {
      if (s.status() == "frozen" && s.version() == version) return std::nullopt;
      if (s.status() != "joinable" || s.version() != version) throw RetryLater{};
      freeze = Clock::now() >= deadline;
      if (!freeze)
        return Change{s.r.node.value, kJoinableEphemeralTtl};  // refreshes the joinable state's TTL
      json state = s.j;
      state["status"] = "frozen";
      state["keep_alives"] = json::array();
      return Change{state.dump(), kFrozenTtl};
    });
    if (!written || freeze) return;
    // Waits for a change up to half the joinable state's TTL. torch oversleeps the last call by up to 1 s
    // here; ddprun closes it on time.
    const auto left = std::max(duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1));
    const auto wait = std::min<milliseconds>(seconds(kJoinableEphemeralTtl) / 2, left);
    if (!watch_in_time(path("/rdzv/active_version"), false, written->etcd_index + 1, wait)) {
      throw join_timed_out();
    }
  }
}

void EtcdRendezvous::do_set_closed() {
  // No rendezvous state (destroyed, or never made): nobody is left to tell.
  update_state(
      [](const State& s) -> std::optional<Change> {
        if (s.status() == "closed") return std::nullopt;
        json state = s.j;
        state["status"] = "closed";
        return Change{state.dump(), std::nullopt};
      },
      IfGone::kNothingToChange);
}

bool EtcdRendezvous::do_is_closed() {
  try {
    return read_state(*client_).status() == "closed";
  } catch (const EtcdKeyError& e) {
    if (!code_is(e, kKeyNotFound)) throw;
    return false;
  }
}

}  // namespace ddprun::rdzv::etcd
