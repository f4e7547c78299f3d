// Unit test of agent/observe/straggler_tracker.h: the straggler rule over samples of the ranks' time before
// their first collective.
#include "agent/observe/straggler_tracker.h"

#include <catch2/catch.hpp>
#include <cmath>

using ddprun::agent::StragglerTracker;

TEST_CASE("a rank 1.5x the job's median for 5 samples in a row is flagged once, cleared after 5 good ones") {
  StragglerTracker t;
  std::map<int, double> s{{0, 0.050}, {1, 0.052}, {2, 0.200}, {3, 0.049}};
  for (int i = 0; i < 4; ++i) CHECK(t.observe(s).empty());
  CHECK_FALSE(t.flagged(2));
  auto out = t.observe(s);
  REQUIRE(out.size() == 1);
  CHECK(out[0].rank == 2);
  CHECK(out[0].flagged);
  CHECK(out[0].seconds == 0.2);
  CHECK(std::abs(out[0].median - 0.051) < 1e-12);  // of 4 ranks: the mean of the middle two
  CHECK(t.flagged(2));
  CHECK(t.observe(s).empty());  // one line per episode
  s[2] = 0.051;
  for (int i = 0; i < 4; ++i) CHECK(t.observe(s).empty());
  CHECK(t.flagged(2));  // one good sample does not end an episode
  out = t.observe(s);
  REQUIRE(out.size() == 1);
  CHECK_FALSE(out[0].flagged);
  CHECK_FALSE(t.flagged(2));
}

TEST_CASE("the streak must be unbroken") {
  StragglerTracker t;
  std::map<int, double> slow{{0, 0.05}, {1, 0.05}, {2, 0.2}}, fine{{0, 0.05}, {1, 0.05}, {2, 0.05}};
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 4; ++i) CHECK(t.observe(slow).empty());
    CHECK(t.observe(fine).empty());
  }
  CHECK_FALSE(t.flagged(2));
}

TEST_CASE("nothing to compare, or too little to matter") {
  StragglerTracker t;
  for (int i = 0; i < 10; ++i) CHECK(t.observe({{0, 1.0}}).empty());  // one rank
  // 3x the median but 2 ms above it: noise of a tiny step, not a straggler.
  for (int i = 0; i < 10; ++i) CHECK(t.observe({{0, 0.001}, {1, 0.001}, {2, 0.003}}).empty());
  // A rank that reports nothing is absent: never flagged, not in the median.
  std::map<int, double> s{{0, 0.05}, {1, 0.3}};
  for (int i = 0; i < 10; ++i) t.observe(s);
  CHECK_FALSE(t.flagged(7));
  t.reset();
  CHECK_FALSE(t.flagged(1));
  CHECK(t.median() == 0);
}

TEST_CASE("a custom factor and window") {
  StragglerTracker t(3.0, 2);
  std::map<int, double> s{{0, 0.1}, {1, 0.1}, {2, 0.25}};  // 2.5x: below 3x
  for (int i = 0; i < 5; ++i) CHECK(t.observe(s).empty());
  s[2] = 0.35;
  CHECK(t.observe(s).empty());
  CHECK(t.observe(s).size() == 1);
}
