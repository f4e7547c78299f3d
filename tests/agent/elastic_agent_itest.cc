// Integration tests of ElasticAgent: the real agent with real workers (tests/bin/fake_worker) and a real
// store on 127.0.0.1 that disappears at each step of a job. The agent must never throw, must end with the
// documented exit code of what was lost when, and must leave no worker behind (a worker that hangs would make
// run() hang: the test's time limit catches that).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/elastic_agent.h"
#include "catch_compat.h"
#include "rendezvous/static_rendezvous.h"
#include "rendezvous/store/store_server.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ddprun::agent::AgentConfig;
using ddprun::agent::ElasticAgent;
using ddprun::rdzv::RendezvousInfo;
using ddprun::rdzv::RoundStop;

// A store on its own thread that the test can make disappear (stop serving, close every connection) at once.
class VanishingStore {
 public:
  VanishingStore()
      : server_(std::make_unique<ddprun::rdzv::StoreServerThread>(
            ddprun::rdzv::StoreServerOptions{.host = "127.0.0.1"})) {
    port_ = server_->port();
  }
  uint16_t port() const { return port_; }
  void vanish() {
    std::lock_guard lock(mu_);
    server_.reset();
  }

 private:
  std::mutex mu_;
  std::unique_ptr<ddprun::rdzv::StoreServerThread> server_;
  uint16_t port_ = 0;
};

// A real rendezvous handler whose store vanishes just before the agent loop's call number `vanish_at`
// (counted from 0 over next_rendezvous, stop_round, node_done, set_closed, is_closed, shutdown,
// note_local_failure and lost_nodes), or before the watcher's first wait when vanish_at is -1.
class VanishAtStep final : public ddprun::rdzv::RendezvousHandler {
 public:
  VanishAtStep(std::unique_ptr<RendezvousHandler> inner, VanishingStore& store, int vanish_at,
               std::vector<std::string>& steps)
      : inner_(std::move(inner)), store_(store), vanish_at_(vanish_at), steps_(steps) {}

  const std::string& run_id() const override { return inner_->run_id(); }

 protected:
  RendezvousInfo do_next_rendezvous(int lws) override {
    return step("next_rendezvous", [&] { return inner_->next_rendezvous(lws); });
  }
  RoundStop do_stop_round(const RoundStop& s) override {
    return step("stop_round", [&] { return inner_->stop_round(s); });
  }
  std::optional<RoundStop> do_wait_round_stopped(std::chrono::milliseconds timeout) override {
    if (vanish_at_ == -1) store_.vanish();
    return inner_->wait_round_stopped(timeout);
  }
  void do_node_done() override {
    step("node_done", [&] { inner_->node_done(); });
  }
  void do_set_closed() override {
    step("set_closed", [&] { inner_->set_closed(); });
  }
  bool do_is_closed() override {
    return step("is_closed", [&] { return inner_->is_closed(); });
  }
  void do_shutdown() override {
    step("shutdown", [&] { inner_->shutdown(); });
  }
  void do_note_local_failure() override {
    step("note_local_failure", [&] { inner_->note_local_failure(); });
  }
  std::vector<int> do_lost_nodes() override {
    return step("lost_nodes", [&] { return inner_->lost_nodes(); });
  }

 private:
  template <typename F>
  auto step(const char* name, F f) -> decltype(f()) {
    if (static_cast<int>(steps_.size()) == vanish_at_) store_.vanish();
    steps_.push_back(name);
    return f();
  }

  std::unique_ptr<RendezvousHandler> inner_;
  VanishingStore& store_;
  int vanish_at_;
  std::vector<std::string>& steps_;
};

struct Outcome {
  int exit_code = -1;
  std::vector<std::string> steps;
};

// One node, one worker running fake_worker with `worker_flags`, max_restarts 1; the store vanishes at step
// `vanish_at` (-1: when the watcher first waits; a number past the last step: never).
Outcome run_job(const std::vector<std::string>& worker_flags, int vanish_at,
                const std::function<void(AgentConfig&)>& adjust = {}) {
  VanishingStore store;
  ddprun::rdzv::StaticRendezvousOptions o;
  o.run_id = "vanish";
  o.master_addr = "127.0.0.1";
  o.master_port = store.port();
  // Test-sized: a lost store is given up on after 1 s (the production defaults are minutes); a live one on
  // loopback answers in milliseconds.
  o.join_timeout = 1s;
  o.connect_timeout = 1s;
  Outcome out;
  auto rdzv = std::make_unique<VanishAtStep>(std::make_unique<ddprun::rdzv::StaticRendezvous>(o), store,
                                             vanish_at, out.steps);
  AgentConfig c;
  std::vector<std::string> argv{FAKE_WORKER_PATH};
  argv.insert(argv.end(), worker_flags.begin(), worker_flags.end());
  c.workers = {{.argv = argv}};
  c.script_name = "fake_worker";
  c.supervision.max_restarts = 1;
  c.supervision.shutdown_grace = 2s;
  c.supervision.exit_barrier_timeout = 2s;
  c.base_env = {{"PATH", "/usr/bin:/bin"}};
  if (adjust) adjust(c);
  ElasticAgent agent(std::move(c), std::move(rdzv));
  out.exit_code = agent.run();  // must not throw
  return out;
}

std::string describe(const Outcome& o) {
  std::string s = "exit " + std::to_string(o.exit_code) + ", steps:";
  for (const auto& step : o.steps) s += " " + step;
  return s;
}

}  // namespace

TEST_CASE("the store vanishing at each step of a successful job: exit 4 before the round, success after") {
  const Outcome full = run_job({"--sleep-ms", "100"}, 1000);
  INFO(describe(full));
  REQUIRE(full.exit_code == 0);
  REQUIRE(full.steps == std::vector<std::string>{"next_rendezvous", "node_done", "set_closed", "shutdown"});
  for (int k = 0; k < static_cast<int>(full.steps.size()); ++k) {
    const Outcome o = run_job({"--sleep-ms", "100"}, k);
    INFO("store vanished before " << full.steps[static_cast<size_t>(k)] << ": " << describe(o));
    // Before the round nothing ran: the rendezvous failed. Once the worker succeeded, the job did.
    CHECK(o.exit_code == (k == 0 ? ddprun::agent::kExitRendezvousFailed : ddprun::agent::kExitSuccess));
  }
}

TEST_CASE("the store vanishing at each step of a failing job: every step ends with its documented code") {
  const Outcome full = run_job({"--exit", "7"}, 1000);
  INFO(describe(full));
  REQUIRE(full.exit_code == 7);
  const std::vector<std::string> round{"lost_nodes", "stop_round", "note_local_failure"};
  std::vector<std::string> expected{"next_rendezvous"};
  expected.insert(expected.end(), round.begin(), round.end());
  expected.push_back("next_rendezvous");
  expected.insert(expected.end(), round.begin(), round.end());
  expected.insert(expected.end(), {"set_closed", "shutdown"});
  REQUIRE(full.steps == expected);
  for (int k = 0; k < static_cast<int>(full.steps.size()); ++k) {
    const Outcome o = run_job({"--exit", "7"}, k);
    const std::string& step = full.steps[static_cast<size_t>(k)];
    INFO("store vanished before " << step << " (step " << k << "): " << describe(o));
    int want = 7;  // after the last round's failure was published: the worker's own code
    if (step == "next_rendezvous") want = ddprun::agent::kExitRendezvousFailed;
    if (step == "lost_nodes" || step == "stop_round") want = ddprun::agent::kExitStoreFailed;
    if (step == "note_local_failure" && k < 5)
      want = ddprun::agent::kExitRendezvousFailed;  // restart fails to join
    CHECK(o.exit_code == want);
  }
}

TEST_CASE("the store vanishing while a worker hangs: the worker is stopped and the agent exits 3") {
  const Outcome o = run_job({"--hang"}, -1);
  INFO(describe(o));
  CHECK(o.exit_code == ddprun::agent::kExitStoreFailed);
}

TEST_CASE(
    "hang detection: workers that stop making progress are stopped, their stacks read with gdb (exit 6)") {
  const auto log_dir = fs::temp_directory_path() / ("ddprun-hang-" + std::to_string(::getpid()));
  const Outcome o = run_job({"--hang"}, 1000, [&](AgentConfig& c) {
    c.supervision.hang_timeout = 1s;
    c.supervision.max_restarts = 0;
    c.log_dir = log_dir;
  });
  INFO(describe(o));
  CHECK(o.exit_code == ddprun::agent::kExitHung);
  // gdb attached to the worker and wrote its stacks into the worker's stderr log (when gdb is installed).
  std::string log;
  for (const auto& e : fs::recursive_directory_iterator(log_dir)) {
    if (e.path().filename() == "stderr.log")
      log += std::string(std::istreambuf_iterator<char>(std::ifstream(e.path()).rdbuf()), {});
  }
  if (std::system("command -v gdb >/dev/null") == 0) CHECK(log.find("in main (") != std::string::npos);
  fs::remove_all(log_dir);
}
