// Interop: libtorch 1.13's C++ c10d::TCPStore as a CLIENT of ddprun's StoreServer.
//
//   libtorch_tcpstore_vs_ddprun_store [--reference]
//
// Starts a StoreServer in-process (StoreServerThread, port 0, auto-detected dialect) and drives it with
// c10d::TCPStore(isServer=false): set/get/add/compareSet/deleteKey/getNumKeys/check/wait, c10d::PrefixStore,
// and watchKey - the legacy WATCH_KEY command that torch 1.13 sends on its second ("callback") connection,
// after which the server pushes {type, key, old value, new value} for every change of the key. The callback
// must see created (old = nullopt), updated and deleted (new = nullopt) events with the right values, in
// order, for changes made by this client and by another one. Keys written by libtorch are read back with
// ddprun's own StoreClient (modern dialect) under the same names.
//
// --reference runs the same checks against torch's own TCPStore server (and ddprun's client in the legacy
// dialect): the expected results are then shown to be torch 1.13's behaviour, not only ours.
// Prints one line per check; exit 0 only when every check passed, 1 otherwise. Every wait has a deadline.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

int failures = 0;

void check(const std::string& name, bool ok, const std::string& detail = "") {
  std::printf("%s%s%s\n", ok ? "ok    " : "FAIL  ", name.c_str(), ok ? "" : (": " + detail).c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

Bytes bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}
std::string str(const Bytes& b) {
  return std::string(b.begin(), b.end());
}

void check_eq(const std::string& name, const std::string& got, const std::string& want) {
  check(name, got == want, "got '" + got.substr(0, 80) + "', want '" + want.substr(0, 80) + "'");
}
void check_eq(const std::string& name, int64_t got, int64_t want) {
  check(name, got == want, "got " + std::to_string(got) + ", want " + std::to_string(want));
}

template <typename Fn>
void check_throws(const std::string& name, Fn fn) {
  try {
    fn();
  } catch (const std::exception&) {
    check(name, true);
    return;
  }
  check(name, false, "nothing thrown");
}

// Records every watchKey callback invocation as "old->new" ("-" for nullopt), thread-safe.
class EventLog {
 public:
  c10d::WatchKeyCallback callback() {
    return [this](c10::optional<std::string> old_value, c10::optional<std::string> new_value) {
      std::lock_guard lock(mu_);
      events_.push_back((old_value ? *old_value : "-") + "->" + (new_value ? *new_value : "-"));
      cv_.notify_all();
    };
  }
  // Waits up to `timeout` for at least `n` events; returns all events seen.
  std::vector<std::string> wait_for(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return events_.size() >= n; });
    return events_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
};

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return "[" + out + "]";
}

void check_events(const std::string& name, EventLog& log, const std::vector<std::string>& want) {
  auto got = log.wait_for(want.size(), 10s);
  check(name, got == want, "got " + join(got) + ", want " + join(want));
}

c10d::TCPStoreOptions client_options(uint16_t port) {
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = 10s;
  return o;
}

using StorePtr = c10::intrusive_ptr<c10d::TCPStore>;

void test_basic(const StorePtr& store, ddprun::rdzv::StoreClient& ours) {
  c10d::TCPStore& t = *store;
  t.set("str", bytes("hello"));
  check_eq("set/get", str(t.get("str")), "hello");
  const Bytes bin = {0, 1, 0, 0xff, 0};
  t.set("bin", bin);
  check("set/get binary with NULs", t.get("bin") == bin);
  t.set("empty", {});
  check("set/get empty value", t.get("empty").empty());
  Bytes big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 3);
  t.set("big", big);
  check("set/get 1 MiB value", t.get("big") == big);
  check_eq("ddprun client reads libtorch's key under the same name", ours.get("str"), "hello");
  check("... binary too", ours.get("bin") == std::string("\0\1\0\xff\0", 5));
  ours.set("from_ddprun", "hi");
  check_eq("libtorch reads ddprun's key", str(t.get("from_ddprun")), "hi");

  check_eq("add new key", t.add("n", 5), 5);
  check_eq("add negative", t.add("n", -7), -2);
  check_eq("add 0 reads", t.add("n", 0), -2);
  check_eq("add stores ASCII decimal", str(t.get("n")), "-2");

  check_eq("compareSet missing+empty expected stores desired", str(t.compareSet("cs", {}, bytes("a"))), "a");
  check_eq("compareSet missing+non-empty expected returns expected",
           str(t.compareSet("cs_none", bytes("e"), bytes("d"))), "e");
  check("... and creates no key", !t.check({"cs_none"}));
  check_eq("compareSet present+equal replaces", str(t.compareSet("cs", bytes("a"), bytes("b"))), "b");
  check_eq("compareSet present+different returns current", str(t.compareSet("cs", bytes("x"), bytes("c"))),
           "b");

  check("check present keys", t.check({"str", "n"}));
  check("check with a missing key", !t.check({"str", "missing"}));

  int64_t n0 = t.getNumKeys();
  t.set("d1", bytes("x"));
  check_eq("getNumKeys counts a new key", t.getNumKeys(), n0 + 1);
  check_eq("getNumKeys agrees with ddprun's num_keys", ours.num_keys(), n0 + 1);
  check("deleteKey present -> true", t.deleteKey("d1"));
  check("deleteKey again -> false", !t.deleteKey("d1"));
  check_eq("getNumKeys after delete", t.getNumKeys(), n0);

  auto t0 = Clock::now();
  t.wait({"str", "n"});
  t.wait({"str"}, 5s);
  check("wait on present keys", Clock::now() - t0 < 5s);
  // Only keys nobody sets later: a 1.13 client abandons a timed-out WAIT and would read its late reply.
  t0 = Clock::now();
  check_throws("wait 1 s on a missing key throws", [&] { t.wait({"str", "never"}, 1000ms); });
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  check("... within bounds (" + std::to_string(took.count()) + " ms)", took >= 900ms && took < 10s);
  t.set("after_timeout", bytes("ok"));
  check_eq("client usable after the timeout", str(t.get("after_timeout")), "ok");

  auto prefixed =
      c10::make_intrusive<c10d::PrefixStore>("inner", c10::make_intrusive<c10d::PrefixStore>("outer", store));
  prefixed->set("k", bytes("v"));
  check_eq("nested c10d::PrefixStore key is outer/inner/k for ddprun too", ours.get("outer/inner/k"), "v");
  check_eq("PrefixStore add", prefixed->add("c", 2), 2);
  check("PrefixStore check", prefixed->check({"k", "c"}));
}

void test_watch(const StorePtr& store, c10d::TCPStore& other, ddprun::rdzv::StoreClient& ours) {
  c10d::TCPStore& t = *store;
  EventLog log;
  t.watchKey("w", log.callback());
  check("watchKey returned (server acknowledged KEY_CALLBACK_REGISTERED)", true);
  t.set("w", bytes("1"));
  check_events("set creates: callback(nullopt, '1')", log, {"-->1"});
  t.set("w", bytes("2"));
  check_events("set updates: callback('1', '2')", log, {"-->1", "1->2"});
  other.set("w", bytes("3"));
  check_events("another client's set is reported", log, {"-->1", "1->2", "2->3"});
  t.add("w", 4);
  check_events("add updates: ('3', '7')", log, {"-->1", "1->2", "2->3", "3->7"});
  t.compareSet("w", bytes("7"), bytes("8"));
  t.compareSet("w", bytes("nope"), bytes("9"));  // no change, no event
  check_events("compareSet updates only on a match", log, {"-->1", "1->2", "2->3", "3->7", "7->8"});
  other.deleteKey("w");
  other.deleteKey("w");  // nothing to delete, no event
  check_events("deleteKey: callback('8', nullopt), once", log,
               {"-->1", "1->2", "2->3", "3->7", "7->8", "8->-"});
  t.compareSet("w", {}, bytes("c"));
  check_events("compareSet creating: (nullopt, 'c')", log,
               {"-->1", "1->2", "2->3", "3->7", "7->8", "8->-", "-->c"});
  ours.set("w", "ddprun");  // a modern-dialect client's change reaches the legacy watcher too
  const std::vector<std::string> all = {"-->1", "1->2", "2->3", "3->7", "7->8", "8->-", "-->c", "c->ddprun"};
  check_events("a ddprun client's set is reported", log, all);
  t.set("unwatched", bytes("x"));  // other keys make no events: the next event must be the sentinel's
  other.set("w", bytes("end"));
  auto with_end = all;
  with_end.push_back("ddprun->end");
  check_events("no events for other keys, exact sequence", log, with_end);

  EventLog add_log;
  t.watchKey("a", add_log.callback());
  other.add("a", 4);
  check_events("add creating a key: (nullopt, '4')", add_log, {"-->4"});

  EventLog prefix_log;
  c10d::PrefixStore prefixed("pw", store);
  prefixed.watchKey("k", prefix_log.callback());
  ours.set("pw/k", "v");
  check_events("PrefixStore watchKey sees 'pw/k' set by ddprun", prefix_log, {"-->v"});
}

}  // namespace

int main(int argc, char** argv) {
  // --reference: run every check against torch's own TCPStore server instead, to prove that the expected
  // results are torch 1.13's behaviour and not only ours.
  const bool reference = argc > 1 && std::string(argv[1]) == "--reference";
  try {
    std::optional<ddprun::rdzv::StoreServerThread> server;
    c10::intrusive_ptr<c10d::TCPStore> torch_server;
    uint16_t port = 0;
    ddprun::rdzv::StoreClientOptions ours_opts;
    ours_opts.timeout = 10s;
    ours_opts.connect_timeout = 10s;
    if (reference) {
      c10d::TCPStoreOptions o = client_options(0);
      o.isServer = true;
      torch_server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
      port = torch_server->getPort();
      ours_opts.dialect = ddprun::rdzv::Dialect::kLegacy;
      std::printf("reference: torch's own TCPStore server on port %u\n", port);
    } else {
      server.emplace(ddprun::rdzv::StoreServerOptions{.host = "127.0.0.1"});
      port = server->port();
      std::printf("ddprun StoreServer on %s\n", server->local_endpoint().c_str());
    }
    ddprun::rdzv::StoreClient ours("127.0.0.1", port, ours_opts);
    {
      // Owned by intrusive_ptr so that PrefixStore can share them (torch's own ownership model).
      auto t = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", client_options(port));
      auto other = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", client_options(port));
      const std::vector<std::pair<const char*, std::function<void()>>> steps = {
          {"basic", [&] { test_basic(t, ours); }},
          {"watchKey", [&] { test_watch(t, *other, ours); }},
      };
      for (const auto& [name, fn] : steps) {
        try {
          fn();
        } catch (const std::exception& e) {
          check(std::string(name) + ": no unexpected exception", false, e.what());
        }
      }
    }
    if (server) {
      auto stats = server->stats();
      check("server dropped no client for misbehaviour", stats.dropped == 0,
            std::to_string(stats.dropped) + " dropped");
    }
  } catch (const std::exception& e) {
    check("setup", false, e.what());
  }
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
