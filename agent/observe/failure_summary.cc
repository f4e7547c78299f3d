#include "agent/observe/failure_summary.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string_view>
#include <system_error>

#include "agent/observe/event_log.h"      // python_dumps
#include "agent/process/worker_launch.h"  // signal_name

namespace ddprun::agent {

namespace {

constexpr char kNotAvailable[] = "<N/A>";
constexpr char kNoTraceback[] =
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";

// Python's str.replace("\n", "\n  "): torch's indentation of a traceback under "traceback : ".
std::string indent_continuations(const std::string& text) {
  std::string out;
  out.reserve(text.size() + text.size() / 16);
  for (char c : text) {
    out += c;
    if (c == '\n') out += "  ";
  }
  return out;
}

// A JSON value read as torch's int(...) would (a number, or a string of digits); nullopt when it would fail.
std::optional<double> seconds_of(const nlohmann::json& t) {
  if (t.is_number()) return t.get<double>();
  if (!t.is_string()) return std::nullopt;
  try {
    size_t used = 0;
    const std::string s = t.get<std::string>();
    double v = std::stod(s, &used);
    if (used != s.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

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
    out.traceback = text;
    return out;
  }
  const auto& m = j["message"];
  if (m.is_string()) {
    // torch: message as is, timestamp = int(error_file_data.get("timestamp", 0)).
    out.message = m.get<std::string>();
    out.traceback = out.message;
    out.timestamp = j.contains("timestamp") ? seconds_of(j["timestamp"]) : 0.0;
    return out;
  }
  if (!m.is_object()) {
    out.message = m.dump();
    out.traceback = out.message;
    return out;
  }
  if (m.contains("message") && m["message"].is_string()) out.message = m["message"].get<std::string>();
  // torch: message.get("extraInfo", {}).get("py_callstack", message.get("message", "<N/A>")).
  std::string shown = m.contains("message") && m["message"].is_string() ? out.message : kNotAvailable;
  if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
    const auto& x = m["extraInfo"];
    if (x.contains("py_callstack") && x["py_callstack"].is_string())
      shown = x["py_callstack"].get<std::string>();
    if (x.contains("timestamp")) out.timestamp = seconds_of(x["timestamp"]);
  }
  out.traceback = indent_continuations(shown);
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

std::string python_signal_name(int sig) {
  if (sig == 34) return "SIGRTMIN";  // Python names only the ends of the real-time range
  if (sig == 64) return "SIGRTMAX";
  if (sig == 29) return "SIGIO";        // glibc's name is SIGPOLL
  std::string name = signal_name(sig);  // Linux's names of the others of 1-31, as Python's
  return name.starts_with("SIG") ? name : kNotAvailable;
}

std::string local_fqdn() {
  static const std::string fqdn = [] {
    std::array<char, HOST_NAME_MAX + 1> buf{};
    if (::gethostname(buf.data(), buf.size() - 1) != 0) return std::string();
    const std::string name = buf.data();
    // socket.gethostbyaddr(name): the first address getaddrinfo gives, then its reverse look-up.
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    addrinfo* res = nullptr;
    if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return name;
    sockaddr_storage addr{};
    std::memcpy(&addr, res->ai_addr, std::min<size_t>(res->ai_addrlen, sizeof addr));
    ::freeaddrinfo(res);
    const void* raw = nullptr;
    socklen_t len = 0;
    if (addr.ss_family == AF_INET) {
      raw = &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr;
      len = sizeof(in_addr);
    } else if (addr.ss_family == AF_INET6) {
      raw = &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
      len = sizeof(in6_addr);
    } else {
      return name;
    }
    hostent entry{};
    hostent* found = nullptr;
    std::vector<char> scratch(16384);
    int err = 0;
    if (::gethostbyaddr_r(raw, len, addr.ss_family, &entry, scratch.data(), scratch.size(), &found, &err) !=
            0 ||
        found == nullptr || found->h_name == nullptr) {
      return name;
    }
    std::vector<std::string> names{found->h_name};
    for (char** a = found->h_aliases; a != nullptr && *a != nullptr; ++a) names.emplace_back(*a);
    for (const std::string& n : names) {
      if (n.find('.') != std::string::npos) return n;
    }
    return names.front();
  }();
  return fqdn;
}

namespace {

// datetime.fromtimestamp(int(t)).isoformat(sep="_") for a whole second: local time.
std::string format_time(double unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

// What torch prints after "traceback : ".
std::string torch_traceback(const WorkerFailure& f) {
  if (!f.error_file.empty()) return f.traceback;
  if (f.signal != 0) {
    return "Signal " + std::to_string(f.signal) + " (" + python_signal_name(f.signal) + ") received by PID " +
           std::to_string(f.pid);
  }
  return kNoTraceback;
}

// Python's len() of one line: code points of UTF-8 text.
size_t code_points(std::string_view line) {
  return static_cast<size_t>(std::count_if(
      line.begin(), line.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

size_t widest_line(const std::string& text) {
  size_t widest = 0;
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    widest = std::max(widest, code_points(std::string_view(text).substr(start, end - start)));
    if (end == std::string::npos) return widest;
    start = end + 1;
  }
}

// torch's _FAILURE_FORMAT_TEMPLATE (no final newline).
std::string format_one(size_t idx, const WorkerFailure& f, const std::string& host) {
  return "[" + std::to_string(idx) + "]:\n" +             //
         "  time      : " + format_time(f.time) + "\n" +  //
         "  host      : " + host + "\n" +                 //
         "  rank      : " + std::to_string(f.rank) + " (local_rank: " + std::to_string(f.local_rank) + ")\n" +
         "  exitcode  : " + std::to_string(f.signal != 0 ? -f.signal : f.exit_code) +
         " (pid: " + std::to_string(f.pid) + ")\n" +                                        //
         "  error_file: " + (f.error_file.empty() ? kNotAvailable : f.error_file) + "\n" +  //
         "  traceback : " + torch_traceback(f);
}

void indented_lines(std::ostringstream& out, const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out << "    " << line << "\n";
}

// ddprun's details of one failure ("" when it has none): a note torch has no place for, the stacks, the
// stderr tail of a worker without an error file.
std::string details(const WorkerFailure& f) {
  std::ostringstream out;
  const bool note =
      !f.message.empty() && (f.error_file.empty() || f.traceback.find(f.message) == std::string::npos);
  if (note) out << "  message   : " << f.message << "\n";
  if (!f.stacks.empty()) {
    out << "  stacks    :\n";
    indented_lines(out, f.stacks);
  }
  if (!f.nccl_trace.empty()) out << "  nccl trace: " << f.nccl_trace << " (torch's NCCL flight recorder)\n";
  if (f.error_file.empty() && !f.traceback.empty()) {
    out << "  stderr    : (its last lines)\n";
    indented_lines(out, f.traceback);
  }
  return out.str();
}

}  // namespace

std::string format_failure_summary(const std::vector<WorkerFailure>& failures, const std::string& script,
                                   const std::string& host) {
  // torch lists the failures in its dict's order (local ranks ascending) and numbers them in that order.
  std::vector<size_t> order(failures.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return failures[a].local_rank < failures[b].local_rank; });
  const size_t root = root_cause(failures);
  const std::string title = script + " FAILED";
  size_t width = code_points(title);
  std::string root_text;
  std::vector<std::string> others;
  for (size_t idx = 0; idx < order.size(); ++idx) {
    std::string text = format_one(idx, failures[order[idx]], host);
    width = std::max(width, widest_line(text));
    (order[idx] == root ? root_text : others.emplace_back()) = std::move(text);
  }
  width = std::min<size_t>(width, 60);
  const std::string border(width, '='), section(width, '-');

  std::ostringstream out;
  out << "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
      << border << "\n"
      << title << "\n"
      << section << "\nFailures:\n";
  if (others.empty()) out << "  <NO_OTHER_FAILURES>\n";
  for (const std::string& o : others) out << o << "\n";
  out << section << "\nRoot Cause (first observed failure):\n" << root_text << "\n" << border << "\n";

  std::string extra;
  for (size_t idx = 0; idx < order.size(); ++idx) {
    const WorkerFailure& f = failures[order[idx]];
    const std::string d = details(f);
    if (d.empty()) continue;
    extra += "[" + std::to_string(idx) + "]: rank " + std::to_string(f.rank) +
             " (local_rank: " + std::to_string(f.local_rank) + ")\n" + d;
  }
  if (!extra.empty()) out << "ddprun: more on these failures:\n" << extra;
  return out.str();
}

std::string format_failure_summary(const std::vector<WorkerFailure>& failures, const std::string& script) {
  return format_failure_summary(failures, script, local_fqdn());
}

namespace {

// torch's _write_error_file after _rm: the whole text, or why not.
std::string replace_file(const std::filesystem::path& path, const std::string& text) {
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
  std::ofstream out(path, std::ios::trunc | std::ios::binary);
  out << text;
  out.flush();
  if (out) return "";
  return "cannot write the error file " + path.string() + ": " + std::strerror(errno);
}

}  // namespace

std::string copy_root_cause_error_file(const WorkerFailure& root_cause, const std::filesystem::path& parent) {
  if (root_cause.error_file.empty()) return "";
  std::ifstream in(root_cause.error_file, std::ios::binary);
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  auto data = nlohmann::ordered_json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (data.is_discarded()) return replace_file(parent, text.str());
  const int error_code = root_cause.signal != 0 ? -root_cause.signal : root_cause.exit_code;
  if (error_code != 0 && data.is_object() && data.contains("message") && data["message"].is_object() &&
      !data["message"].contains("errorCode")) {
    data["message"]["errorCode"] = error_code;
  }
  return replace_file(parent, python_dumps(data));
}

std::string write_launcher_error_file(const std::string& message, const std::filesystem::path& parent) {
  nlohmann::ordered_json record;
  record["message"]["message"] = message;
  record["message"]["extraInfo"]["py_callstack"] = message;
  record["message"]["extraInfo"]["timestamp"] = std::to_string(static_cast<long long>(std::time(nullptr)));
  return replace_file(parent, python_dumps(record));
}

}  // namespace ddprun::agent
