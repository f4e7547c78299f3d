#include "agent/failure_summary.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ddprun::agent {

std::optional<ErrorFileContent> read_error_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  ErrorFileContent out;
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) {
    out.message = text;
    return out;
  }
  const auto& m = j["message"];
  if (m.is_string()) {
    out.message = m.get<std::string>();
    return out;
  }
  if (m.is_object()) {
    if (m.contains("message") && m["message"].is_string()) out.message = m["message"].get<std::string>();
    if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
      const auto& x = m["extraInfo"];
      if (x.contains("py_callstack") && x["py_callstack"].is_string()) {
        out.traceback = x["py_callstack"].get<std::string>();
      }
      if (x.contains("timestamp")) {
        const auto& t = x["timestamp"];
        if (t.is_number()) {
          out.timestamp = t.get<double>();
        } else if (t.is_string()) {
          try {
            out.timestamp = std::stod(t.get<std::string>());
          } catch (const std::exception&) {
          }
        }
      }
    }
  }
  return out;
}

std::string read_tail(const std::filesystem::path& path, size_t lines) {
  std::ifstream in(path);
  if (!in) return {};
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  std::string out;
  for (const auto& l : tail) out += l + "\n";
  return out;
}

size_t root_cause(const std::vector<WorkerFailure>& failures) {
  // min_element keeps the first of equal elements: ties go to the failure observed first.
  auto it = std::min_element(failures.begin(), failures.end(), [](const auto& a, const auto& b) {
    return std::floor(a.time) < std::floor(b.time);
  });
  return static_cast<size_t>(it - failures.begin());
}

std::string describe_exit(int exit_code, int signal) {
  if (signal != 0) return "signal " + std::to_string(signal) + " (" + signal_name(signal) + ")";
  return "exitcode " + std::to_string(exit_code);
}

namespace {

std::string format_time(double unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

void format_one(std::ostringstream& out, const WorkerFailure& f) {
  out << "  time      : " << format_time(f.time) << "\n"
      << "  host      : " << f.host << "\n"
      << "  rank      : " << f.rank << " (local_rank: " << f.local_rank << ")\n"
      << "  exitcode  : " << (f.signal ? -f.signal : f.exit_code) << " (" << describe_exit(f.exit_code, f.signal)
      << ")\n"
      << "  pid       : " << f.pid << "\n"
      << "  error_file: " << (f.error_file.empty() ? "<N/A>" : f.error_file) << "\n";
  if (!f.message.empty()) out << "  message   : " << f.message << "\n";
  if (!f.stacks.empty()) {
    out << "  stacks    :\n";
    std::istringstream st(f.stacks);
    for (std::string line; std::getline(st, line);) out << "    " << line << "\n";
  }
  out << "  traceback : " << (f.traceback.empty() ? "<N/A>\n" : "\n");
  std::istringstream tb(f.traceback);
  for (std::string line; std::getline(tb, line);) out << "    " << line << "\n";
}

}  // namespace

std::string format_failure_summary(const std::vector<WorkerFailure>& failures, const std::string& script) {
  std::ostringstream out;
  std::string rule(72, '=');
  size_t root = root_cause(failures);
  out << rule << "\n" << script << " FAILED\n" << std::string(72, '-') << "\nFailures:\n";
  int others = 0;
  for (size_t i = 0; i < failures.size(); ++i) {
    if (i == root) continue;
    out << "[" << ++others << "]:\n";
    format_one(out, failures[i]);
  }
  if (others == 0) out << "  <NO_OTHER_FAILURES>\n";
  out << std::string(72, '-') << "\nRoot Cause (first observed failure):\n[0]:\n";
  format_one(out, failures[root]);
  out << rule << "\n";
  return out.str();
}

}  // namespace ddprun::agent
