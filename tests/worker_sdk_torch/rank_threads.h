// Test harness: every rank is a thread of this process with its own store client and CPU process group
// (make_cpu_process_group over a StoreServerThread on 127.0.0.1, port 0).
//
// Catch2 assertions are not thread-safe: rank bodies return or record values; the test thread asserts.
// An exception escaping a body is caught and returned, one message per rank ("" = none).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/backends.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"

namespace ddprun::sdk::testing {

inline std::vector<std::string> run_ranks(int world, const std::function<void(int, ProcessGroup&)>& body,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  using namespace std::chrono_literals;
  rdzv::StoreServerThread server(rdzv::StoreServerOptions{.host = "127.0.0.1"});
  static std::atomic<int> serial{0};
  const std::string prefix = "torch_test_pg" + std::to_string(serial++);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        rdzv::StoreClient store("127.0.0.1", server.port(), {.connect_timeout = 10s, .timeout = timeout});
        ProcessGroupOptions o;
        o.timeout = timeout;
        o.advertise_address = "127.0.0.1";
        auto pg = make_cpu_process_group(store, prefix, r, world, o);
        body(r, *pg);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        if (errors[static_cast<size_t>(r)].empty()) errors[static_cast<size_t>(r)] = "(empty what())";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline bool all_empty(const std::vector<std::string>& v) {
  for (const auto& s : v) {
    if (!s.empty()) return false;
  }
  return true;
}

}  // namespace ddprun::sdk::testing
