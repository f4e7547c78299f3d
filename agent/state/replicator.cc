#include "agent/state/replicator.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "agent/state/state_connection.h"
#include "agent/state/state_peers.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::agent {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
constexpr milliseconds kConnectTimeout{10000};
constexpr milliseconds kIdle{30000};
constexpr milliseconds kFirstBackoff{1000};
constexpr milliseconds kMaxBackoff{30000};
constexpr uint64_t kBurst = uint64_t{1} << 20;

}  // namespace

Replicator::Replicator(const StateDirectory& dir, uint64_t bandwidth)
    : dir_(dir), limiter_(bandwidth, kBurst) {
  inotify_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!inotify_) throw std::system_error(errno, std::generic_category(), "training state: inotify_init1");
  if (::inotify_add_watch(inotify_.get(), dir_.own().c_str(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
    throw std::system_error(errno, std::generic_category(),
                            "training state: inotify_add_watch " + dir_.own().string());
  }
  wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_) throw std::system_error(errno, std::generic_category(), "training state: eventfd");
  thread_ = std::thread([this] { run(); });
}

Replicator::~Replicator() {
  stop_ = true;
  wake();
  thread_.join();
}

void Replicator::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

void Replicator::set_target(std::optional<Target> target) {
  {
    std::lock_guard lock(mu_);
    target_ = std::move(target);
    ++target_serial_;
  }
  wake();
}

Replicator::Stats Replicator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

bool Replicator::wait(std::optional<Clock::time_point> until) {
  while (!stop_) {
    int timeout = -1;
    if (until) {
      const auto left = std::chrono::duration_cast<milliseconds>(*until - Clock::now()).count();
      if (left <= 0) return true;
      timeout = static_cast<int>(std::min<int64_t>(left + 1, 1 << 30));
    }
    pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {inotify_.get(), POLLIN, 0}};
    if (::poll(fds, 2, timeout) < 0 && errno != EINTR) return false;
    char drain[4096];
    if (fds[0].revents != 0) {
      while (::read(wake_.get(), drain, 8) > 0) {
      }
      return !stop_;  // a new target, or the stop
    }
    if (fds[1].revents != 0) {
      while (::read(inotify_.get(), drain, sizeof drain) > 0) {
      }
      if (!until) return true;  // a commit; with a retry pending, it waits for the retry
    }
  }
  return false;
}

bool Replicator::sleep_until(Clock::time_point at) {
  while (!stop_) {
    const auto left = std::chrono::duration_cast<milliseconds>(at - Clock::now()).count();
    if (left <= 0) return true;
    pollfd p{wake_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left + 1, 1 << 30))) < 0 && errno != EINTR)
      return false;
    if (p.revents != 0) {
      char drain[8];
      while (::read(wake_.get(), drain, sizeof drain) > 0) {
      }
    }
  }
  return false;
}

std::optional<rdzv::Endpoint> Replicator::resolve(const Target& t) {
  const std::string key = node_state_key(t.store.run_id, t.round, t.buddy);
  try {
    rdzv::StoreClientOptions options;
    options.connect_timeout = kConnectTimeout;
    options.timeout = kConnectTimeout;
    options.auth = t.store.auth;
    rdzv::StoreClient store(t.store.host, t.store.port, options);
    const auto deadline = Clock::now() + kBuddyWait;
    while (!stop_) {
      try {
        store.wait({key},
                   std::min<milliseconds>(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()),
                                          milliseconds(1000)));
        break;
      } catch (const rdzv::WaitTimeoutError&) {
        if (Clock::now() >= deadline) throw;
      }
    }
    if (stop_) return std::nullopt;
    std::string why;
    const auto doc = read_node_state(store.get(key), why);
    if (!doc) {
      spdlog::warn("training state: node {}'s document in round {} is unreadable ({}): no copies to it",
                   t.buddy, t.round, why);
      return std::nullopt;
    }
    return doc->addr;
  } catch (const rdzv::StoreError& e) {
    spdlog::warn(
        "training state: cannot learn where node {} (the buddy of this node) keeps copies in round {}: {}",
        t.buddy, t.round, e.what());
    return std::nullopt;
  }
}

void Replicator::copy(const rdzv::Endpoint& buddy, const StoredVersion& v, int fd, uint64_t bytes) {
  StateConnection c = StateConnection::connect(buddy.host, buddy.port, kConnectTimeout, kIdle);
  std::shared_ptr<const rdzv::StoreAuth> auth;
  {
    std::lock_guard lock(mu_);
    if (target_) auth = target_->store.auth;
  }
  c.client_handshake(auth.get());
  c.send(StateMessage{
      .kind = StateMessage::Kind::kPut, .rank = v.name.rank, .step = v.name.step, .bytes = bytes});
  c.send_file(fd, bytes,
              [this](uint64_t chunk) { return sleep_until(limiter_.reserve(chunk, Clock::now())); });
  const StateMessage answer = c.receive();
  if (answer.kind == StateMessage::Kind::kError)
    throw StateTransferError("the agent at " + c.peer() + " refused the copy: " + answer.text);
  if (answer.kind != StateMessage::Kind::kOk)
    throw StateTransferError("the agent at " + c.peer() + " answered oddly");
}

bool Replicator::copy_new_versions(const Target& t, const rdzv::Endpoint& buddy) {
  for (int rank : t.ranks) {
    const auto v = StateDirectory::newest(dir_.own(), rank);
    if (!v) continue;
    UniqueFd fd(::open(v->file.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0) continue;  // superseded meanwhile: the next pass has it
    const Sent identity{v->name.step, static_cast<uint64_t>(st.st_ino)};
    if (sent_[rank] == identity) continue;
    const auto start = Clock::now();
    try {
      copy(buddy, *v, fd.get(), static_cast<uint64_t>(st.st_size));
    } catch (const StateTransferError& e) {
      if (stop_) return false;  // the agent stops: the copy was given up on purpose
      std::lock_guard lock(mu_);
      ++stats_.failures;
      spdlog::warn("training state: the copy of rank {}'s step {} to node {} failed: {}", rank, v->name.step,
                   t.buddy, e.what());
      return false;
    }
    sent_[rank] = identity;
    std::lock_guard lock(mu_);
    stats_.replicated[rank] = v->name.step;
    ++stats_.copies;
    stats_.bytes += static_cast<uint64_t>(st.st_size);
    spdlog::debug("training state: rank {}'s step {} ({}) copied to node {} at {} in {} ms", rank,
                  v->name.step, mib_text(static_cast<uint64_t>(st.st_size)), t.buddy, buddy.to_string(),
                  std::chrono::duration_cast<milliseconds>(Clock::now() - start).count());
  }
  return true;
}

void Replicator::run() {
  uint64_t serial = 0;
  std::optional<Target> target;
  std::optional<rdzv::Endpoint> buddy, last_buddy;
  milliseconds backoff = kFirstBackoff;
  std::optional<Clock::time_point> retry_at;
  while (!stop_) {
    {
      std::lock_guard lock(mu_);
      if (serial != target_serial_) {
        serial = target_serial_;
        target = target_;
        buddy.reset();
        retry_at.reset();
        backoff = kFirstBackoff;
      }
    }
    bool ok = true;
    if (target && !buddy) {
      buddy = resolve(*target);
      ok = buddy.has_value();
      if (buddy && buddy != last_buddy) {
        sent_.clear();  // a new buddy: the newest version of every rank goes there
        last_buddy = buddy;
      }
    }
    if (target && buddy) ok = copy_new_versions(*target, *buddy);
    if (ok) {
      retry_at.reset();
      backoff = kFirstBackoff;
    } else {
      retry_at = Clock::now() + backoff;
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
    if (!wait(retry_at)) return;
  }
}

}  // namespace ddprun::agent
