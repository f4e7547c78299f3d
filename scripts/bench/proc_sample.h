// What the store benchmarks read about a process from /proc: a server's memory and descriptors, and the CPU
// time it and this process used. Linux only; zeros (or -1 for CPU time) when the process cannot be read.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace ddprun::bench {

// Memory and descriptors of the server process, from /proc; zeros when unavailable.
struct ServerSample {
  int64_t rss_kb = 0;
  int64_t hwm_kb = 0;
  int64_t fds = 0;
};

inline ServerSample sample_server(int pid) {
  ServerSample s;
  if (pid <= 0) return s;
  std::string dir = "/proc/" + std::to_string(pid);
  std::ifstream status(dir + "/status");
  std::string line;
  while (std::getline(status, line)) {
    auto field = [&](std::string_view name, int64_t& out) {
      if (line.starts_with(name)) out = std::stoll(line.substr(name.size()));
    };
    field("VmRSS:", s.rss_kb);
    field("VmHWM:", s.hwm_kb);
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++s.fds;
  }
  return s;
}

// CPU time used so far by the server process (all threads; -1 when unknown) and by this process.
struct CpuTimes {
  double server_s = -1;
  double self_s = 0;
};

inline CpuTimes sample_cpu(int pid) {
  CpuTimes t;
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    t.self_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
               static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  }
  if (pid <= 0) return t;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto paren = stat.rfind(')');  // the command name may contain spaces
  if (paren == std::string::npos) return t;
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);  // fields 14 and 15: utime, stime
  }
  t.server_s = ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  return t;
}

}  // namespace ddprun::bench
