#include "launcher/flag_values.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "rendezvous/store/endpoint.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::launcher {

namespace {

// The keys of --rdzv_conf that ddprun reads: torchrun's (docs/cli.md lists them with their meaning).
// clang-format off
const std::vector<std::string> kRdzvConfKeys = {
    "join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout", "keep_alive_interval",
    "keep_alive_max_attempt", "read_timeout", "is_host", "timeout", "failover", "store_type",
    "protocol", "cacert", "cert", "key", "etcd_prefix", "ssl_cert", "ssl_cert_key", "ca_cert"};
// clang-format on

// Signal names without "SIG", as --signals_to_handle takes them.
const std::vector<std::pair<std::string, int>> kSignalNames = {
    {"HUP", SIGHUP},   {"INT", SIGINT},     {"QUIT", SIGQUIT}, {"ILL", SIGILL},   {"TRAP", SIGTRAP},
    {"ABRT", SIGABRT}, {"BUS", SIGBUS},     {"FPE", SIGFPE},   {"KILL", SIGKILL}, {"USR1", SIGUSR1},
    {"SEGV", SIGSEGV}, {"USR2", SIGUSR2},   {"PIPE", SIGPIPE}, {"ALRM", SIGALRM}, {"TERM", SIGTERM},
    {"CHLD", SIGCHLD}, {"CONT", SIGCONT},   {"STOP", SIGSTOP}, {"TSTP", SIGTSTP}, {"TTIN", SIGTTIN},
    {"TTOU", SIGTTOU}, {"URG", SIGURG},     {"XCPU", SIGXCPU}, {"XFSZ", SIGXFSZ}, {"VTALRM", SIGVTALRM},
    {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"IO", SIGIO},     {"PWR", SIGPWR},   {"SYS", SIGSYS}};

}  // namespace

void fail_because(const Given& g, const std::string& reason) {
  std::string msg = "ddprun: invalid " + g.flag + " value '" + g.text + "'";
  if (!g.env.empty()) msg += " (from " + g.env + ")";
  throw UsageError(msg + ": " + reason);
}

void fail(const Given& g, const std::string& expected) {
  fail_because(g, "expected " + expected);
}

std::optional<long long> to_int(const std::string& raw) {
  const std::string s = trim(raw);
  // 18 characters never overflow; "+-1" is not a number (Python's int() agrees).
  if (s.size() > 18 || s.starts_with("+-")) return std::nullopt;
  return parse_int(s);
}

std::optional<double> to_double(const std::string& raw) {
  std::string s = trim(raw);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

int int_at_least(const Given& g, long long min) {
  auto v = to_int(g.text);
  if (!v || *v < min || *v > 1'000'000'000) fail(g, "an integer >= " + std::to_string(min));
  return static_cast<int>(*v);
}

double seconds(const Given& g) {
  auto v = to_double(g.text);
  if (!v || *v < 0 || *v > kMaxSeconds) fail(g, "a number of seconds from 0 to 1000000000 (about 31 years)");
  return *v;
}

uint64_t byte_size(const Given& g, uint64_t min) {
  auto v = parse_byte_size(trim(g.text));
  if (!v || *v < min) {
    fail(g, "a size of at least " + std::to_string(min) +
                " bytes: a whole number with an optional unit K, M or G "
                "(binary), like 256M");
  }
  return *v;
}

std::string one_of(const Given& g, const std::vector<std::string>& choices) {
  for (const auto& c : choices) {
    if (g.text == c) return c;
  }
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  fail(g, "one of " + list);
}

std::pair<int, int> parse_nnodes(const Given& g) {
  auto parts = split(g.text, ':');
  std::optional<long long> lo = to_int(parts[0]), hi = parts.size() == 2 ? to_int(parts[1]) : lo;
  if (parts.size() > 2 || !lo || !hi || *lo < 1 || *hi < *lo || *hi > 1'000'000) {
    fail(g, "N or MIN:MAX with 1 <= MIN <= MAX");
  }
  return {static_cast<int>(*lo), static_cast<int>(*hi)};
}

int parse_nproc_per_node(const Given& g, const std::function<int()>& gpu_count) {
  const std::string spec = trim(g.text);
  auto cpus = [] { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); };
  if (spec == "cpu") return cpus();
  if (spec == "gpu") {
    const int n = gpu_count();
    if (n <= 0) {
      throw UsageError("ddprun: --nproc_per_node=gpu but no GPU (CUDA or ROCm) is visible" +
                       (g.env.empty() ? std::string() : " (from " + g.env + ")"));
    }
    return n;
  }
  if (spec == "auto") {
    const int n = gpu_count();
    return n > 0 ? n : cpus();
  }
  auto v = to_int(g.text);
  if (!v || *v < 1 || *v > 1'000'000) fail(g, "a positive integer, cpu, gpu or auto");
  return static_cast<int>(*v);
}

bool is_rdzv_conf_key(const std::string& key) {
  return std::find(kRdzvConfKeys.begin(), kRdzvConfKeys.end(), key) != kRdzvConfKeys.end();
}

std::map<std::string, std::string> parse_rdzv_conf(const Given& g) {
  std::map<std::string, std::string> conf;
  if (trim(g.text).empty()) return conf;
  for (const auto& item : split(g.text, ',')) {
    auto eq = item.find('=');
    std::string key = trim(item.substr(0, eq));
    if (key.empty() || eq == std::string::npos || trim(item.substr(eq + 1)).empty()) {
      fail(g, "KEY=VALUE,... ('" + item + "' is not KEY=VALUE)");
    }
    std::string value = trim(item.substr(eq + 1));
    std::string lower;
    for (char c : value) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!is_rdzv_conf_key(key)) {
      conf[key] = value;  // torch ignores what its backend does not read; so does ddprun (with a warning)
    } else if (key == "store_type") {
      if (lower != "tcp") {
        fail(g,
             "store_type=tcp (ddprun's rendezvous store is a TCP store; torch's 'file' store is not "
             "supported), not '" +
                 value + "'");
      }
      conf[key] = lower;
    } else if (key == "protocol") {
      if (lower != "http" && lower != "https") fail(g, "protocol=http or https, not '" + value + "'");
      conf[key] = lower;
    } else if (key == "cacert" || key == "cert" || key == "key" || key == "etcd_prefix" ||
               key == "ssl_cert" || key == "ssl_cert_key" || key == "ca_cert") {
      conf[key] = value;  // files and an etcd path: checked by etcd_conf
    } else if (key == "is_host" || key == "failover") {
      if (lower == "1" || lower == "true" || lower == "t" || lower == "yes" || lower == "y") {
        conf[key] = "true";
      } else if (lower == "0" || lower == "false" || lower == "f" || lower == "no" || lower == "n") {
        conf[key] = "false";
      } else {
        fail(g, key + " to be a boolean (1/0, true/false, yes/no), not '" + value + "'");
      }
    } else {
      auto n = to_int(value);
      if (!n || *n <= 0) fail(g, key + " to be a positive integer (seconds or count), not '" + value + "'");
      conf[key] = std::to_string(*n);
    }
  }
  return conf;
}

std::vector<rdzv::Endpoint> parse_rdzv_endpoint(const Given& g, bool c10d, uint16_t default_port) {
  std::vector<rdzv::Endpoint> endpoints;
  if (trim(g.text).empty()) return endpoints;
  const auto items = split(g.text, ',');
  if (items.size() > 1 && !c10d) {
    fail(g, "one host:port (a list of endpoints, tried in order, needs --rdzv_backend c10d or etcd)");
  }
  for (const auto& item : items) {
    const std::string endpoint = trim(item);
    if (endpoint.empty()) fail(g, "host[:port],... without an empty entry");
    std::string err;
    auto port = c10d ? std::optional<uint16_t>(default_port) : std::nullopt;
    auto parsed = rdzv::parse_endpoint(endpoint, port, err);
    if (!parsed) {
      std::string err_prefix = "invalid endpoint '" + endpoint + "': ";
      if (err.rfind(err_prefix, 0) == 0) err = err.substr(err_prefix.size());
      if (err.rfind("no port", 0) == 0) fail(g, "host:port (the static backend needs a port)");
      fail_because(g, items.size() > 1 ? "'" + endpoint + "': " + err : err);
    }
    endpoints.push_back(*parsed);
  }
  return endpoints;
}

std::string parse_master_addr(const Given& g) {
  std::string err;
  if (rdzv::parse_endpoint(trim(g.text), std::nullopt, err))
    fail(g, "a host without port (use --master_port)");
  auto ep = rdzv::parse_endpoint(trim(g.text), 1, err);
  if (!ep) fail(g, "a host name or address: " + err);
  return ep->host;
}

uint16_t parse_master_port(const Given& g) {
  auto p = rdzv::parse_port(trim(g.text));
  if (!p) fail(g, "a port number in 0..65535");
  return *p;
}

std::optional<std::set<int>> parse_local_ranks_filter(const Given& g) {
  if (trim(g.text).empty()) return std::nullopt;
  std::set<int> ranks;
  for (const auto& item : split(g.text, ',')) {
    auto v = to_int(item);
    if (!v || *v < 0 || *v > 1'000'000) fail(g, "local ranks >= 0, comma-separated, like 0,2");
    ranks.insert(static_cast<int>(*v));
  }
  return ranks;
}

std::vector<int> parse_signals(const Given& g) {
  std::vector<int> out;
  for (const auto& raw : split(g.text, ',')) {
    std::string name = trim(raw);
    std::string upper;
    for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (upper.rfind("SIG", 0) == 0) upper = upper.substr(3);
    int sig = 0;
    if (auto n = to_int(name)) {
      if (*n >= 1 && *n <= SIGRTMAX) sig = static_cast<int>(*n);
    } else {
      for (const auto& [n2, s] : kSignalNames) {
        if (upper == n2) sig = s;
      }
    }
    if (sig == 0)
      fail(g, "signal names (SIGTERM, TERM) or numbers 1.." + std::to_string(SIGRTMAX) +
                  ", comma-separated ('" + name + "' is not a signal)");
    if (sig == SIGKILL || sig == SIGSTOP || sig == SIGCHLD) {
      fail(g, "signals ddprun can forward ('" + name + "' cannot be caught or is used by ddprun itself)");
    }
    if (std::find(out.begin(), out.end(), sig) == out.end()) out.push_back(sig);
  }
  return out;
}

EtcdConf etcd_conf(const std::map<std::string, std::string>& conf, bool legacy,
                   std::vector<std::string>& warnings) {
  EtcdConf e;
  auto value = [&conf](const char* key) {
    auto it = conf.find(key);
    return it == conf.end() ? std::string() : it->second;
  };
  e.https = value("protocol") == "https";
  // torch's names: etcd (EtcdRendezvousHandler) and etcd-v2 (EtcdRendezvousBackend) differ.
  const char* ca = legacy ? "cacert" : "ca_cert";
  const char* cert = legacy ? "cert" : "ssl_cert";
  const char* key = legacy ? "key" : "ssl_cert_key";
  e.ca_file = value(ca);
  e.cert_file = value(cert);
  e.key_file = value(key);
  // The other backend's names for the same files would leave TLS silently off: say which name this one reads.
  const char* other_names[][2] = {{"cacert", "ca_cert"}, {"cert", "ssl_cert"}, {"key", "ssl_cert_key"}};
  for (const auto& names : other_names) {
    const char* mine = names[legacy ? 0 : 1];
    const char* other = names[legacy ? 1 : 0];
    if (!value(other).empty()) {
      warnings.push_back(std::string("--rdzv_conf ") + other + "=" + value(other) + " is not used: it is " +
                         (legacy ? "etcd-v2" : "etcd") + "'s name, --rdzv_backend " +
                         (legacy ? "etcd" : "etcd-v2") + " reads " + mine +
                         "= (TLS is off for what is not given so)");
    }
  }
  if (legacy && !value("etcd_prefix").empty()) e.prefix = value("etcd_prefix");
  for (const char* k : {ca, cert, key}) {
    const std::string file = value(k);
    if (file.empty()) continue;
    if (::access(file.c_str(), R_OK) != 0) {
      throw UsageError(std::string("ddprun: --rdzv_conf ") + k + "=" + file + ": cannot read the file (" +
                       std::strerror(errno) + ")");
    }
    if (!e.https) {
      warnings.push_back(std::string("--rdzv_conf ") + k + "=" + file +
                         " is not used without protocol=https (etcd is reached over plain HTTP)");
    }
  }
  return e;
}

RdzvTimings rdzv_timings(const std::map<std::string, std::string>& conf) {
  auto get = [&conf](const char* key, double fallback) {
    auto it = conf.find(key);
    return it == conf.end() ? fallback : std::stod(it->second);
  };
  RdzvTimings t;
  t.join_timeout = get("join_timeout", get("timeout", t.join_timeout));
  t.last_call_timeout = get("last_call_timeout", t.last_call_timeout);
  t.close_timeout = get("close_timeout", t.close_timeout);
  t.keep_alive_interval = get("keep_alive_interval", t.keep_alive_interval);
  t.read_timeout = get("read_timeout", t.read_timeout);
  if (conf.count("keep_alive_max_attempt")) {
    t.keep_alive_max_attempt = static_cast<int>(get("keep_alive_max_attempt", 3));
  } else if (conf.count("heartbeat_timeout")) {
    t.keep_alive_max_attempt =
        std::max(1, static_cast<int>(std::ceil(get("heartbeat_timeout", 15) / t.keep_alive_interval)));
  }
  return t;
}

Std StdSpec::for_rank(int local_rank) const {
  auto it = per_rank.find(local_rank);
  return it != per_rank.end() ? it->second : all;
}

std::optional<StdSpec> parse_std_spec(const std::string& text) {
  auto digit = [](const std::string& s) -> std::optional<Std> {
    if (s.size() != 1 || s[0] < '0' || s[0] > '3') return std::nullopt;
    return static_cast<Std>(s[0] - '0');
  };
  StdSpec spec;
  if (auto v = digit(text)) {
    spec.all = *v;
    return spec;
  }
  for (const auto& item : split(text, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos || colon == 0) return std::nullopt;
    std::string rank = item.substr(0, colon);
    if (rank.size() > 7 || rank.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    auto v = digit(item.substr(colon + 1));
    if (!v) return std::nullopt;
    spec.per_rank[static_cast<int>(*parse_int(rank))] = *v;
  }
  return spec;
}

std::vector<std::string> comma_separated_list(const std::string& text) {
  // torch: replace ",," by a placeholder, split on ",", put the commas back.
  std::vector<std::string> out{""};
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      out.back() += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      out.back() += ',';
      ++i;
    } else {
      out.emplace_back();
    }
  }
  return out;
}

}  // namespace ddprun::launcher
