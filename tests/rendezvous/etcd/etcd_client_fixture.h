// Shared by the EtcdClient integration tests (etcd_client_itest.cc, etcd_client_failover_itest.cc,
// etcd_client_tls_itest.cc): one etcd member for the tests that only read and write keys, client options with
// a short request timeout, and small helpers. Header-only; nothing here waits without a deadline.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "error_text.h"
#include "etcd_process.h"
#include "rendezvous/etcd/etcd_client.h"

namespace ddprun::rdzv::etcd::client_fixture {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// One member for the tests that only read and write keys (each under a prefix of its own): started once,
// by the first test that asks, for every test file of the executable.
inline testing::EtcdProcess& shared_etcd() {
  static testing::EtcdProcess etcd;
  return etcd;
}

inline ClientOptions options_for(std::vector<Endpoint> endpoints,
                                 std::chrono::milliseconds timeout = 2000ms) {
  ClientOptions options;
  options.endpoints = std::move(endpoints);
  options.request_timeout = timeout;
  return options;
}

inline std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

using testing::error_text;

}  // namespace ddprun::rdzv::etcd::client_fixture
