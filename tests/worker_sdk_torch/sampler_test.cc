// DistributedSampler against Python torch's: sampler_reference.py prints torch's indices for a grid of
// (n, world, rank, shuffle, drop_last, seed, epoch); every case must match exactly.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "catch_compat.h"
#include "ddprun/distributed_sampler.h"

using ddprun::sdk::DistributedSampler;

namespace {

// Runs the reference script; returns its stdout and exit status.
std::pair<std::string, int> run_reference() {
  const std::string cmd = std::string(DDPRUN_TORCH_PYTHON) + " " + SAMPLER_REFERENCE_PY;
  FILE* f = ::popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = ::pclose(f);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

}  // namespace

TEST_CASE("DistributedSampler yields exactly torch's indices", "[sampler]") {
  auto [out, rc] = run_reference();
  if (rc == 77) {
    std::puts("SKIPPED: " DDPRUN_TORCH_PYTHON " cannot import torch; DistributedSampler not compared");
    WARN("SKIPPED: no Python torch");
    return;
  }
  REQUIRE(rc == 0);
  auto doc = nlohmann::json::parse(out);
  const auto& cases = doc.at("cases");
  REQUIRE(cases.size() > 500);
  size_t shuffled_nontrivial = 0;
  for (const auto& c : cases) {
    DistributedSampler s(c["n"].get<int64_t>(), c["world"].get<int>(), c["rank"].get<int>(),
                         {.shuffle = c["shuffle"].get<bool>(),
                          .seed = c["seed"].get<uint64_t>(),
                          .drop_last = c["drop_last"].get<bool>()});
    s.set_epoch(c["epoch"].get<int64_t>());
    INFO("case " << c.dump().substr(0, 160));
    REQUIRE(s.num_samples() == c["num_samples"].get<int64_t>());
    REQUIRE(s.total_size() == c["total_size"].get<int64_t>());
    REQUIRE(s.indices() == c["indices"].get<std::vector<int64_t>>());
    if (c["shuffle"].get<bool>() && c["n"].get<int64_t>() > 100) ++shuffled_nontrivial;
  }
  CHECK(shuffled_nontrivial > 50);
}

TEST_CASE("DistributedSampler: shards are disjoint, epochs reshuffle, bad ranks are refused", "[sampler]") {
  std::vector<int> seen(103, 0);
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(103, 4, r, {.shuffle = true, .seed = 5, .drop_last = true});
    for (int64_t i : s.indices()) ++seen[static_cast<size_t>(i)];
    CHECK(s.num_samples() == 25);
  }
  int total = 0;
  for (int v : seen) {
    CHECK(v <= 1);
    total += v;
  }
  CHECK(total == 100);
  DistributedSampler a(50, 2, 0);
  auto e0 = a.indices();
  a.set_epoch(1);
  CHECK(a.indices() != e0);
  CHECK_THROWS_WITH(DistributedSampler(10, 2, 2), Catch::Contains("invalid rank 2"));
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0), std::invalid_argument);
}
