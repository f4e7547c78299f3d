// Interop: ddprun's StoreClient against PyTorch's own TCPStore server: torch 1.13's (legacy dialect) or
// torch 2.x's (modern dialect).
//
//   ddprun_client_vs_torch_store HOST PORT [--dialect legacy|modern]     (default legacy)
//
// Run by run_client_vs_torch_store.py, which starts the torch server, seeds keys with a torch client before
// this program runs (py/*, py_outer/py_inner/k) and reads the keys this program leaves behind (cpp/*,
// cpp_outer/cpp_inner/k) after it exits. In the legacy dialect the modern-only operations must be refused
// without a byte sent; in the modern one they run against torch's server (APPEND, MULTI_GET, MULTI_SET,
// PING, and CANCEL_WAIT after a wait timeout). Prints one line per check ("ok    ..." / "FAIL  ...: detail").
// Exit codes: 0 every check passed, 1 some check failed (or an unexpected exception), 2 bad arguments.
// Every blocking call has a deadline (store timeout 10 s), so the program always ends.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/store/endpoint.h"
#include "rendezvous/store/prefix_store.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_error.h"
#include "rendezvous/store/wire_codec.h"

namespace {

using namespace ddprun::rdzv;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int failures = 0;

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 64) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

void check(const std::string& name, bool ok, const std::string& detail = "") {
  std::printf("%s%s%s\n", ok ? "ok    " : "FAIL  ", name.c_str(), ok ? "" : (": " + detail).c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

void check_eq(const std::string& name, const std::string& got, const std::string& want) {
  check(name, got == want, "got '" + printable(got) + "', want '" + printable(want) + "'");
}

void check_eq(const std::string& name, int64_t got, int64_t want) {
  check(name, got == want, "got " + std::to_string(got) + ", want " + std::to_string(want));
}

// Runs `fn`, expecting an exception of type E.
template <typename E>
void check_throws(const std::string& name, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E&) {
    check(name, true);
    return;
  } catch (const std::exception& e) {
    check(name, false, std::string("wrong exception: ") + e.what());
    return;
  }
  check(name, false, "nothing thrown");
}

// 1 MiB that is not all one byte, so a shifted or truncated copy is caught. The Python runner builds the
// same.
std::string big_value() {
  std::string v(1 << 20, '\0');
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<char>((i * 31 + 7) & 0xff);
  return v;
}

Dialect dialect = Dialect::kLegacy;  // set once by main() from --dialect

StoreClientOptions client_options() {
  StoreClientOptions o;
  o.dialect = dialect;
  o.connect_timeout = 10s;
  o.timeout = 10s;
  return o;
}

void test_keys_from_torch(StoreClient& s) {
  check_eq("get str set by torch", s.get("py/str"), "from torch");
  check_eq("get binary set by torch", s.get("py/bin"), std::string("\0\xffz\0", 4));
  check_eq("get counter added by torch", s.get("py/counter"), "7");
  check_eq("add 0 on torch's counter", s.add("py/counter", 0), 7);
  auto base = std::shared_ptr<Store>(&s, [](Store*) {});
  PrefixStore nested("py_inner", std::make_shared<PrefixStore>("py_outer", base));
  check_eq("nested PrefixStore reads torch's nested PrefixStore key", nested.get("k"), "nested from torch");
}

void test_set_get(StoreClient& s) {
  s.set("cpp/str", "from ddprun");
  check_eq("set/get str", s.get("cpp/str"), "from ddprun");
  const std::string bin("a\0b\0\0\xff", 6);
  s.set("cpp/bin", bin);
  check_eq("set/get binary with NULs", s.get("cpp/bin"), bin);
  s.set("cpp/empty", "");
  check_eq("set/get empty value", s.get("cpp/empty"), "");
  const std::string big = big_value();
  s.set("cpp/big", big);
  check("set/get 1 MiB value", s.get("cpp/big") == big, "mismatch");
  s.set("cpp/over", "one");
  s.set("cpp/over", "two");
  check_eq("set overwrites", s.get("cpp/over"), "two");
}

void test_add(StoreClient& s) {
  check_eq("add on a new key returns delta", s.add("cpp/n", 5), 5);
  check_eq("add negative", s.add("cpp/n", -8), -3);
  check_eq("add 0 reads", s.add("cpp/n", 0), -3);
  check_eq("add stores ASCII decimal", s.get("cpp/n"), "-3");
  check_eq("add leaves 42 for torch to read", s.add("cpp/counter", 42), 42);
}

void test_compare_set(StoreClient& s) {
  check_eq("compare_set missing+empty expected stores desired", s.compare_set("cpp/cs", "", "first"),
           "first");
  check_eq("compare_set missing+non-empty expected returns expected",
           s.compare_set("cpp/cs_none", "exp", "des"), "exp");
  check("... and creates no key", !s.check({"cpp/cs_none"}), "key exists");
  check_eq("compare_set present+equal replaces", s.compare_set("cpp/cs", "first", "second"), "second");
  check_eq("compare_set present+different returns current", s.compare_set("cpp/cs", "nope", "third"),
           "second");
  check_eq("... and keeps it", s.get("cpp/cs"), "second");
}

void test_check(StoreClient& s) {
  check("check on present keys", s.check({"cpp/str", "py/str"}), "false");
  check("check with a missing key", !s.check({"cpp/str", "cpp/never"}), "true");
}

void test_wait(StoreClient& s, const std::string& host, uint16_t port) {
  auto t0 = Clock::now();
  s.wait({"cpp/str", "py/str"}, 5s);
  check("wait on present keys", Clock::now() - t0 < 5s);

  t0 = Clock::now();
  check_throws<TimeoutError>("wait 300 ms on a missing key throws TimeoutError", [&] {
    s.wait({"cpp/str", "cpp/late"}, 300ms);
  });
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  check("... within bounds (" + std::to_string(took.count()) + " ms)", took >= 270ms && took < 10s);
  // Legacy: the client dropped the connection (a 1.13 server cannot cancel a WAIT) and the next call
  // reconnects. Modern: it sent CANCEL_WAIT and keeps the connection. Either way, setting the abandoned key
  // must not disturb anyone.
  s.set("cpp/late", "here");
  check_eq("after the timeout: set/get works", s.get("cpp/late"), "here");
  s.wait({"cpp/late"}, 5s);
  check("wait on the formerly missing key", true);

  StoreClientOptions shortopt = client_options();
  shortopt.timeout = 300ms;
  StoreClient short_client(host, port, shortopt);
  check_throws<TimeoutError>("get on a missing key times out with the store timeout",
                             [&] { short_client.get("cpp/never"); });

  // A wait in another thread, woken by this client's set.
  std::atomic<int> result{-1};
  std::string error;
  std::thread waiter([&] {
    try {
      StoreClient other(host, port, client_options());
      other.set("cpp/waiter_ready", "1");
      other.wait({"cpp/wake"}, 30s);
      result = other.get("cpp/wake") == "awake" ? 1 : 0;
    } catch (const std::exception& e) {
      error = e.what();
      result = 0;
    }
  });
  s.wait({"cpp/waiter_ready"}, 30s);
  s.set("cpp/wake", "awake");
  waiter.join();
  check("wait in another client woken by this client's set", result == 1, error);
}

void test_delete_num_keys(StoreClient& s) {
  int64_t n0 = s.num_keys();
  s.set("cpp/d1", "x");
  s.set("cpp/d2", "y");
  check_eq("num_keys counts new keys", s.num_keys(), n0 + 2);
  check("delete_key present -> true", s.delete_key("cpp/d1"), "false");
  check("delete_key again -> false", !s.delete_key("cpp/d1"), "true");
  check_eq("num_keys after delete", s.num_keys(), n0 + 1);
  check("deleted key is gone (check)", !s.check({"cpp/d1"}), "still there");
}

void test_prefix_store(StoreClient& s) {
  auto base = std::shared_ptr<Store>(&s, [](Store*) {});
  auto outer = std::make_shared<PrefixStore>("cpp_outer", base);
  PrefixStore inner("cpp_inner", outer);
  inner.set("k", "nested from ddprun");
  check_eq("nested PrefixStore key is cpp_outer/cpp_inner/k", s.get("cpp_outer/cpp_inner/k"),
           "nested from ddprun");
  check_eq("PrefixStore add", inner.add("n", 3), 3);
  check_eq("PrefixStore compare_set", inner.compare_set("cs", "", "a"), "a");
  check("PrefixStore check", inner.check({"k", "n", "cs"}), "false");
  inner.wait({"k"}, 5s);
  check_throws<TimeoutError>("PrefixStore wait on a missing key", [&] { inner.wait({"zz"}, 300ms); });
  check("PrefixStore delete_key", inner.delete_key("cs"), "false");
  check("... gone underneath", !s.check({"cpp_outer/cpp_inner/cs"}), "still there");
}

// Modern dialect: a cancelled wait is forgotten by torch's server. When another client sets the key later,
// no late reply may reach this connection (it would shift every reply after it).
void test_cancel_wait(StoreClient& s, const std::string& host, uint16_t port) {
  check_throws<TimeoutError>("wait 300 ms on a missing key (CANCEL_WAIT)",
                             [&] { s.wait({"cpp/after_cancel"}, 300ms); });
  StoreClient other(host, port, client_options());
  other.set("cpp/after_cancel", "ok");
  check_eq("the key set later by another client: the next reply here is right", s.get("cpp/str"),
           "from ddprun");
  check_eq("... and so is the get of that key", s.get("cpp/after_cancel"), "ok");
  for (int i = 0; i < 3; ++i) {
    check_throws<TimeoutError>("repeated wait timeouts on one connection",
                               [&] { s.wait({"cpp/never_c"}, 200ms); });
  }
  check_eq("... leave it usable", s.add("cpp/counter", 0), 42);
}

// Modern dialect: the operations torch 2.x's server has beyond 1.13's (no queues: torch 2.6's server has
// none).
void test_modern_ops(StoreClient& s, const std::string& host, uint16_t port) {
  s.append("cpp/a", "x");
  s.append("cpp/a", std::string("\0y", 2));
  check_eq("append creates, then concatenates", s.get("cpp/a"), std::string("x\0y", 3));
  int64_t n = s.num_keys();
  s.multi_set({"cpp/m1", "cpp/m2", "cpp/m3"}, {"one", std::string("\0two", 4), ""});
  check_eq("multi_set adds three keys", s.num_keys(), n + 3);
  auto got = s.multi_get({"cpp/m3", "cpp/m1", "cpp/m2", "cpp/m1"});
  check("multi_get in order, with repeats",
        got == std::vector<std::string>{"", "one", std::string("\0two", 4), "one"},
        got.size() == 4 ? "got '" + printable(got[0]) + "', '" + printable(got[1]) + "', '" +
                              printable(got[2]) + "', '" + printable(got[3]) + "'"
                        : std::to_string(got.size()) + " values");
  check("check sees multi_set's and append's keys", s.check({"cpp/m1", "cpp/m3", "cpp/a"}), "false");
  StoreClientOptions shortopt = client_options();
  shortopt.timeout = 300ms;
  StoreClient short_client(host, port, shortopt);
  check_throws<TimeoutError>("multi_get with a missing key times out", [&] {
    short_client.multi_get({"cpp/m1", "cpp/m_never"});
  });
  check_eq("... and the client stays usable", short_client.get("cpp/m1"), "one");
  auto rtt = s.ping();
  check("ping: torch's server echoes the nonce", rtt < std::chrono::seconds(10),
        std::to_string(rtt.count()) + " us");
}

// APPEND, MULTI_GET/SET, QUEUE_*, PING do not exist in torch 1.13: the client refuses them before sending
// anything, and the connection stays usable.
void test_modern_only_refused(StoreClient& s) {
  check_throws<InvalidArgumentError>("append refused in the legacy dialect", [&] { s.append("cpp/a", "x"); });
  check_throws<InvalidArgumentError>("multi_set refused", [&] { s.multi_set({"cpp/m"}, {"x"}); });
  check_throws<InvalidArgumentError>("multi_get refused", [&] { s.multi_get({"cpp/str"}); });
  check_throws<InvalidArgumentError>("queue_push refused", [&] { s.queue_push("cpp/q", "x"); });
  check_throws<InvalidArgumentError>("queue_len refused", [&] { s.queue_len("cpp/q"); });
  check_throws<InvalidArgumentError>("ping refused", [&] { s.ping(); });
  check_eq("connection still usable after refusals", s.get("cpp/str"), "from ddprun");
  check("refused ops left no keys", !s.check({"cpp/a"}) && !s.check({"cpp/m"}), "a key appeared");
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Dialect> chosen = Dialect::kLegacy;
  if (argc == 5 && std::string(argv[3]) == "--dialect") chosen = parse_dialect(argv[4]);
  if ((argc != 3 && argc != 5) || (argc == 5 && std::string(argv[3]) != "--dialect") || !chosen ||
      *chosen == Dialect::kMid2023) {
    std::fprintf(stderr, "usage: %s HOST PORT [--dialect legacy|modern]\n", argv[0]);
    return 2;
  }
  dialect = *chosen;
  std::string host = argv[1];
  auto port = parse_port(argv[2]);
  if (!port) {
    std::fprintf(stderr, "bad port '%s'\n", argv[2]);
    return 2;
  }
  try {
    StoreClient s(host, *port, client_options());
    std::vector<std::pair<const char*, std::function<void()>>> steps = {
        {"keys from torch", [&] { test_keys_from_torch(s); }},
        {"set/get", [&] { test_set_get(s); }},
        {"add", [&] { test_add(s); }},
        {"compare_set", [&] { test_compare_set(s); }},
        {"check", [&] { test_check(s); }},
        {"wait", [&] { test_wait(s, host, *port); }},
        {"delete_key/num_keys", [&] { test_delete_num_keys(s); }},
        {"PrefixStore", [&] { test_prefix_store(s); }},
    };
    if (dialect == Dialect::kModern) {
      steps.emplace_back("cancelled wait", [&] { test_cancel_wait(s, host, *port); });
      steps.emplace_back("modern ops", [&] { test_modern_ops(s, host, *port); });
    } else {
      steps.emplace_back("modern-only ops refused", [&] { test_modern_only_refused(s); });
    }
    for (const auto& [name, fn] : steps) {
      try {
        fn();
      } catch (const std::exception& e) {
        check(std::string(name) + ": no unexpected exception", false, e.what());
      }
    }
  } catch (const std::exception& e) {
    check("connect to the torch store", false, e.what());
  }
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
