#include "agent/observe/lifecycle_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include "rendezvous/util/unix_time.h"

namespace ddprun::agent {

void LifecycleLog::open(const std::filesystem::path& file, std::string run_id, std::string host) {
  file_ = file;
  run_id_ = std::move(run_id);
  host_ = std::move(host);
  fd_ = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::system_error(
        errno, std::generic_category(),
        "cannot open the event log " + file.string() + " (--event_log_handler file:PATH)");
  }
}

LifecycleLog::~LifecycleLog() {
  if (fd_ >= 0) ::close(fd_);
}

void LifecycleLog::record(const std::string& event, const EventFields& fields) {
  if (fd_ < 0) return;
  EventFields line = {{"v", 1},
                      {"time", unix_now()},
                      {"event", event},
                      {"run_id", run_id_},
                      {"host", host_},
                      {"agent_pid", ::getpid()},
                      {"round", round_ >= 0 ? EventFields(round_) : EventFields()}};
  for (const auto& [k, v] : fields.items()) line[k] = v;
  const std::string text = line.dump(-1, ' ', false, EventFields::error_handler_t::replace) + "\n";
  const ssize_t n = ::write(fd_, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    spdlog::error("cannot write the event log {}: {}; no more events go to it", file_.string(),
                  n < 0 ? std::error_code(errno, std::generic_category()).message() : "a short write");
    ::close(fd_);
    fd_ = -1;
  }
}

}  // namespace ddprun::agent
