// ddprun-store: runs the rendezvous store alone, for tests, benchmarks and users who want a standing store.
//
//   ddprun-store [--host ADDR] [--port N] [--dialect auto|legacy|mid2023|modern] [--memory-budget SIZE]
//                [--secret-file FILE [--handshake-timeout-ms N] [--max-handshakes-per-address N]] [limits...]
//   ddprun-store --version     (launcher/version.h)
//
// Prints "ddprun-store listening on ADDR:PORT" on stdout once it accepts connections (port 0 picks one).
// Stops cleanly on SIGINT/SIGTERM. Exit codes: 0 stopped by a signal, 2 bad flags, 3 cannot listen.
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <iostream>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "launcher/version.h"
#include "rendezvous/auth/hmac_auth.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/util/text_util.h"

namespace {

// Lets one store hold as many connections as the hard limit allows (10,000+ idle clients).
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// The flags, as given; server_options() makes the server's options of them.
struct Flags {
  ddprun::rdzv::StoreServerOptions opts;
  std::string dialect = "auto";
  std::string log_level = "info";
  size_t request_timeout_ms = static_cast<size_t>(opts.request_timeout.count());
  size_t handshake_timeout_ms = static_cast<size_t>(opts.handshake_timeout.count());
  std::string memory_budget, secret_file;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--host", f.opts.host, "Address to listen on (default: every interface, IPv4 and IPv6)");
  app.add_option("--port", f.opts.port, "TCP port; 0 picks a free one")->check(CLI::Range(0, 65535));
  app.add_option("--dialect", f.dialect, "Protocol dialect: auto detects it per connection")
      ->check(CLI::IsMember({"auto", "legacy", "mid2023", "modern"}));
  app.add_option("--max-connections", f.opts.max_connections,
                 "Connections beyond this are closed at accept (default: the descriptor limit minus 64)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-key-bytes", f.opts.limits.max_key_bytes, "Longest key accepted")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-value-bytes", f.opts.limits.max_value_bytes, "Longest value accepted")
      ->check(CLI::PositiveNumber);
  app.add_option("--request-timeout-ms", f.request_timeout_ms,
                 "A client must complete a request it started within this time")
      ->check(CLI::PositiveNumber);
  app.add_option(
      "--memory-budget", f.memory_budget,
      "Memory the store may hold for its clients (unfinished requests, unread replies; a stored value "
      "queued for many clients counts once): bytes, or with a unit K, M, G (binary). Default: four of "
      "the largest values (256M with the default --max-value-bytes)");
  app.add_option(
      "--secret-file", f.secret_file,
      "The job's secret (as the agents' --rdzv_secret_file): only agents that prove it may touch the "
      "job's keys, other clients only worker keys from the job's nodes (docs/security.md)");
  app.add_option(
         "--handshake-timeout-ms", f.handshake_timeout_ms,
         "With --secret-file: a client from an address that is not the job's must authenticate within "
         "this time")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-handshakes-per-address", f.opts.max_handshakes_per_address,
                 "With --secret-file: connections from one address (an IPv6 /64) that is not the job's, open "
                 "at once before they authenticated; beyond, closed at accept")
      ->check(CLI::PositiveNumber);
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
}

// Completes f.opts from the other flags (the memory budget, the secret). False, with a message on stderr,
// when one is invalid (exit code 2).
bool server_options(Flags& f) {
  using namespace ddprun::rdzv;
  StoreServerOptions& opts = f.opts;
  if (f.dialect != "auto") opts.dialect = parse_dialect(f.dialect);
  opts.request_timeout = std::chrono::milliseconds(f.request_timeout_ms);
  opts.handshake_timeout = std::chrono::milliseconds(f.handshake_timeout_ms);
  opts.limits.max_request_bytes = std::max(opts.limits.max_request_bytes,
                                           2 * opts.limits.max_value_bytes + opts.limits.max_key_bytes + 64);
  opts.memory_budget = default_memory_budget(opts.limits);
  if (!f.memory_budget.empty()) {
    auto bytes = ddprun::parse_byte_size(f.memory_budget);
    if (!bytes || *bytes < (uint64_t{1} << 20)) {
      std::cerr << "ddprun-store: invalid --memory-budget value '" << f.memory_budget
                << "': expected a size of at least 1M: a whole number with an optional unit K, M or G "
                   "(binary), like 256M\n";
      return false;
    }
    opts.memory_budget = *bytes;
  }
  if (!f.secret_file.empty()) {
    try {
      opts.auth = std::make_shared<HmacAuth>(read_secret_file(f.secret_file));
    } catch (const std::runtime_error& e) {
      std::cerr << "ddprun-store: " << e.what() << "; check --secret-file\n";
      return false;
    }
  }
  return true;
}

// Listens, serves until SIGINT or SIGTERM. The exit code: 0 stopped by a signal, 3 cannot listen.
int serve(const ddprun::rdzv::StoreServerOptions& opts) {
  using namespace ddprun::rdzv;
  boost::asio::io_context io;
  std::unique_ptr<StoreServer> server;
  try {
    server = std::make_unique<StoreServer>(io, opts);
  } catch (const BindError& e) {
    std::cerr << "ddprun-store: " << e.what() << "; pick another --port (0: a free one)\n";
    return 3;
  }
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    auto s = server->stats();
    spdlog::info("store: stopping on signal {} ({} keys, {} clients, {} requests served)", sig, s.keys,
                 s.connections, s.requests);
    server->stop();
    io.stop();
  });
  std::cout << "ddprun-store listening on " << server->local_endpoint() << std::endl;
  io.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddprun-store: a TCPStore-compatible rendezvous store"};
  app.set_version_flag("--version", ddprun::launcher::version_text("ddprun-store"));
  Flags flags;
  add_flags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  if (!server_options(flags)) return 2;
  raise_fd_limit();
  return serve(flags.opts);
}
