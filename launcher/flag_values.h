// Flag values: the parsers of single ddprun command-line values, one value each (a count, a node range, a
// duration, a signal list, rdzv_conf's KEY=VALUE list, an endpoint...). The LaunchConfig parser
// (launcher/launch_config.h) decides where a value comes from (flag, PET_ variable, Slurm, default) and
// combines them; the functions here only judge one value.
//
// Every parser takes a Given (the text as the user wrote it and where it came from) and returns the value,
// or throws UsageError whose what() is the whole user-facing message (the few that take plain text, at the
// end, return nullopt instead):
//   "ddprun: invalid --flag value 'text' (from PET_FLAG): expected <what is expected>"
// ("(from ...)" only when the value came from the environment). Nothing else is thrown.
//
// Pure: no processes, sockets or files, except parse_nproc_per_node (std::thread::hardware_concurrency and
// the gpu_count it is given). Thread-safe (no shared state).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/store/endpoint.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::launcher {

// A bad command line; what() is the whole user-facing message.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One value as the user gave it, and where it came from, so that messages can name it.
struct Given {
  std::string flag;  // canonical spelling, "--nnodes"
  std::string text;  // the value
  std::string env;   // "PET_NNODES" when it came from the environment, else ""
};

// Throws "ddprun: invalid --flag value 'v' (from PET_FLAG): <reason>".
[[noreturn]] void fail_because(const Given& g, const std::string& reason);
// fail_because(g, "expected " + expected).
[[noreturn]] void fail(const Given& g, const std::string& expected);

// ---- text helpers (never throw) ----

// Decimal integer with optional sign, surrounding blanks allowed (as Python's int()); at most 18 characters
// once trimmed. (Splitting, trimming and env_or: rendezvous/util/text_util.h.)
std::optional<long long> to_int(const std::string& raw);
// A finite number as strtod reads it, surrounding blanks allowed.
std::optional<double> to_double(const std::string& raw);

// ---- one value each (throw UsageError) ----

// An integer in min..1e9.
int int_at_least(const Given& g, long long min);
// A number of seconds from 0 to kMaxSeconds (fractions allowed): any duration a job can want, and one that
// every clock's arithmetic holds (a steady_clock deadline of now + 1e9 s is far from overflowing).
constexpr double kMaxSeconds = 1e9;
double seconds(const Given& g);
// A size in bytes of at least `min`: a whole number with an optional binary unit, "256M", "1G", "65536"
// (rendezvous/util/text_util.h's parse_byte_size; blanks around it allowed).
uint64_t byte_size(const Given& g, uint64_t min);
// Exactly one of `choices` (case-sensitive); returns it.
std::string one_of(const Given& g, const std::vector<std::string>& choices);

// --nnodes: "N" or "MIN:MAX" with 1 <= MIN <= MAX <= 1e6. Returns {MIN, MAX} ({N, N} for "N").
std::pair<int, int> parse_nnodes(const Given& g);

// --nproc_per_node: a positive integer (<= 1e6), "cpu" (hardware threads, at least 1), "gpu" (gpu_count();
// an error when it is 0) or "auto" (gpu_count() when > 0, else as "cpu"). gpu_count is called only for gpu
// and auto and must not be empty.
int parse_nproc_per_node(const Given& g, const std::function<int()>& gpu_count);

// --rdzv_conf: "KEY=VALUE,..."; blank = no entries. The keys ddprun reads (is_rdzv_conf_key): join_timeout,
// last_call_timeout, close_timeout, heartbeat_timeout, keep_alive_interval, keep_alive_max_attempt,
// read_timeout, is_host, timeout, failover, store_type. Their values normalised: is_host and failover
// "true"/"false" (from 1/0, true/false, t/f, yes/no, y/n, any case), store_type "tcp" (any case; torch's
// "file" is refused), every other key a positive integer in plain decimal. Any other key is kept with its
// value as given (trimmed): torch ignores the keys its backend does not read, and the caller warns. A
// repeated key keeps its last value.
bool is_rdzv_conf_key(const std::string& key);
std::map<std::string, std::string> parse_rdzv_conf(const Given& g);

// The rendezvous timings a parsed --rdzv_conf gives, with torchrun's defaults and its aliases resolved:
// heartbeat_timeout (given without keep_alive_max_attempt) sets keep_alive_max_attempt to
// ceil(heartbeat_timeout / keep_alive_interval); "timeout" (torchrun's static backend's store timeout) is
// join_timeout when that is not given. Seconds, except keep_alive_max_attempt (a count >= 1).
struct RdzvTimings {
  double join_timeout = 600;
  double last_call_timeout = 30;
  double close_timeout = 30;
  double keep_alive_interval = 5;
  int keep_alive_max_attempt = 3;
  double read_timeout = 60;
};
RdzvTimings rdzv_timings(const std::map<std::string, std::string>& conf);

// --rdzv_conf's etcd keys (torchrun's names: etcd's protocol, cacert, cert, key, etcd_prefix; etcd-v2's
// protocol, ssl_cert, ssl_cert_key, ca_cert), checked: the files exist and are
// readable (UsageError naming the key and the file otherwise); TLS keys without protocol=https: a warning, as
// they are not used.
struct EtcdConf {
  bool https = false;                        // protocol=https
  std::string ca_file;                       // cacert / ca_cert
  std::string cert_file;                     // cert / ssl_cert
  std::string key_file;                      // key / ssl_cert_key
  std::string prefix = "/torchelastic/p2p";  // etcd_prefix (etcd only)
};
EtcdConf etcd_conf(const std::map<std::string, std::string>& conf, bool legacy,
                   std::vector<std::string>& warnings);

// A duration given in seconds (the flags and RdzvTimings), as the milliseconds the agent and handlers take.
inline std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::clamp(seconds, 0.0, kMaxSeconds) * 1000));
}

// --rdzv_endpoint: "host[:port]" (rendezvous/store/endpoint.h), trimmed; blank = none (empty). The static
// backend (c10d false) needs the port; c10d and etcd (c10d true) default it (29400, etcd's 2379) and take a
// comma-separated list, tried in order (the store failover: rendezvous/c10d/store_failover.h; etcd's
// members).
std::vector<rdzv::Endpoint> parse_rdzv_endpoint(const Given& g, bool c10d, uint16_t default_port = 29400);

// --master_addr: a host name or address without a port; "[::1]" gives "::1".
std::string parse_master_addr(const Given& g);
// --master_port: a port number in 0..65535.
uint16_t parse_master_port(const Given& g);

// --local_ranks_filter: "0,2" (local ranks 0..1e6, comma-separated). nullopt for a blank value (no filter).
std::optional<std::set<int>> parse_local_ranks_filter(const Given& g);

// --signals_to_handle: names (SIGTERM, TERM, sigterm) or numbers 1..SIGRTMAX, comma-separated. Returns the
// signal numbers in the order given, without duplicates. SIGKILL, SIGSTOP and SIGCHLD are refused.
std::vector<int> parse_signals(const Given& g);

// ---- values read from plain text (never throw: the caller words the error) ----

// Where a worker's stdout/stderr go besides the console: torchrun's --redirects/--tee values (bit 1 = stdout,
// bit 2 = stderr).
enum class Std : uint8_t { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

// A --redirects/--tee spec: "3" (every local rank) or "0:1,1:2" (per local rank; ranks not listed get kNone).
struct StdSpec {
  Std all = Std::kNone;
  std::map<int, Std> per_rank;
  Std for_rank(int local_rank) const;
  bool operator==(const StdSpec&) const = default;
};

// Parses "N" (0..3) or "LR:N,LR:N,..." (LR >= 0, multi-digit allowed: a superset of torchrun's one digit).
std::optional<StdSpec> parse_std_spec(const std::string& text);

// torchrun's comma_separated_list: "a,b" -> {"a", "b"}; ",," stands for a comma ("a,,b" -> {"a,b"}); "" ->
// {""} (an empty filter, which every line contains).
std::vector<std::string> comma_separated_list(const std::string& text);

}  // namespace ddprun::launcher
