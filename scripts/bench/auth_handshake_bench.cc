// The store handshake's cost to an agent's connection (docs/security.md): StoreClient connections (connect,
// VALIDATE, PING, and AUTH where the store requires it) over loopback to an open store, to one that requires
// the job's secret (HMAC-SHA256), and to one that requires MUNGE credentials (--munge-socket: a running
// munged; scripts/bench-store-auth.sh starts a private one), N of each, alternating. Prints a Markdown table.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <vector>

#include "rendezvous/auth/hmac_auth.h"
#include "rendezvous/auth/munge_auth.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"

using namespace ddprun::rdzv;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  CLI::App app{"ddprun-auth-handshake-bench: the store handshake's cost per agent connection"};
  int connections = 500;
  std::string munge_socket;
  app.add_option("--connections", connections, "Connections to each store")->check(CLI::Range(1, 1000000));
  app.add_option("--munge-socket", munge_socket, "A running munged's socket (none: no MUNGE row)");
  CLI11_PARSE(app, argc, argv);

  struct Mode {
    std::string label;
    std::shared_ptr<const StoreAuth> auth;
    std::vector<double> micros;
  };
  std::vector<Mode> modes;
  modes.push_back({"open", nullptr, {}});
  modes.push_back({"`--rdzv_secret_file` (HMAC-SHA256)", std::make_shared<HmacAuth>(random_nonce()), {}});
  if (!munge_socket.empty()) {
    auto munge = std::make_shared<MungeAuth>(munge_socket, "Slurm job 1, run bench");
    if (std::string why = munge->check(); !why.empty()) {
      std::fprintf(stderr, "ddprun-auth-handshake-bench: %s\n", why.c_str());
      return 1;
    }
    modes.push_back({"MUNGE (`--rdzv_auth`, under Slurm)", munge, {}});
  }
  std::vector<std::unique_ptr<StoreServerThread>> servers;
  for (const Mode& m : modes) {
    servers.push_back(
        std::make_unique<StoreServerThread>(StoreServerOptions{.host = "127.0.0.1", .auth = m.auth}));
  }
  for (int i = 0; i < connections; ++i) {
    for (size_t k = 0; k < modes.size(); ++k) {
      const auto start = Clock::now();
      StoreClient client("127.0.0.1", servers[k]->port(), StoreClientOptions{.auth = modes[k].auth});
      modes[k].micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
  }
  std::ifstream loadavg("/proc/loadavg");
  std::string l1, l5, l15;
  loadavg >> l1 >> l5 >> l15;
  std::printf("%d StoreClient connections to each store over loopback, alternating; load %s %s %s\n\n",
              connections, l1.c_str(), l5.c_str(), l15.c_str());
  std::printf(
      "| store requires | connect + VALIDATE + PING (+ AUTH): median | p90 | p99 | AUTH adds (median) |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  double open_median = 0;
  for (Mode& m : modes) {
    std::sort(m.micros.begin(), m.micros.end());
    auto at = [&](double f) {
      return m.micros[std::min(m.micros.size() - 1, static_cast<size_t>(f * m.micros.size()))];
    };
    if (!m.auth) open_median = at(0.5);
    std::printf("| %s | %.0f µs | %.0f µs | %.0f µs | %s |\n", m.label.c_str(), at(0.5), at(0.9), at(0.99),
                m.auth ? (std::to_string(static_cast<int>(at(0.5) - open_median)) + " µs").c_str() : "");
  }
  return 0;
}
