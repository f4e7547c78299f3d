// Unit tests for the duplicate filters' line matcher (agent/process/output_pump.h): torch's
// `any(needle in line for needle in filters)` on a line with its '\n'.
#include "agent/process/output_pump.h"

#include <string>
#include <vector>

#include "catch_compat.h"

using ddprun::agent::line_matches;

TEST_CASE("output_pump: a line matches when it contains any filter", "[agent][output_pump]") {
  const std::vector<std::string> filters{"loss", "acc"};
  CHECK(line_matches("epoch 1 loss=0.5\n", filters));
  CHECK(line_matches("acc 0.9\n", filters));
  CHECK_FALSE(line_matches("epoch 1\n", filters));
  CHECK_FALSE(line_matches("LOSS\n", filters));  // case-sensitive, as Python's `in`
  CHECK_FALSE(line_matches("anything\n", {}));
}

TEST_CASE("output_pump: an empty filter matches every line, the empty one too", "[agent][output_pump]") {
  CHECK(line_matches("x\n", {""}));
  CHECK(line_matches("\n", {"nomatch", ""}));
}

TEST_CASE("output_pump: the line end takes part in the match, as in torch", "[agent][output_pump]") {
  CHECK(line_matches("a\n", {"a\n"}));
  CHECK_FALSE(line_matches("a", {"a\n"}));  // the last line of a stream, without its '\n'
}
