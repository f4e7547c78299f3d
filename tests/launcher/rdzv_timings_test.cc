// rdzv_timings: torchrun's defaults, each key, and the aliases (heartbeat_timeout, the static "timeout").
#include "catch_compat.h"
#include "launcher/flag_values.h"

using ddprun::launcher::rdzv_timings;
using Conf = std::map<std::string, std::string>;

TEST_CASE("rdzv_timings: torchrun's defaults without keys", "[launcher][rdzv_conf]") {
  const auto t = rdzv_timings({});
  CHECK(t.join_timeout == 600);
  CHECK(t.last_call_timeout == 30);
  CHECK(t.close_timeout == 30);
  CHECK(t.keep_alive_interval == 5);
  CHECK(t.keep_alive_max_attempt == 3);
  CHECK(t.read_timeout == 60);
}

TEST_CASE("rdzv_timings: every key is read", "[launcher][rdzv_conf]") {
  const auto t = rdzv_timings(Conf{{"join_timeout", "7"},
                                   {"last_call_timeout", "2"},
                                   {"close_timeout", "3"},
                                   {"keep_alive_interval", "1"},
                                   {"keep_alive_max_attempt", "9"},
                                   {"read_timeout", "11"}});
  CHECK(t.join_timeout == 7);
  CHECK(t.last_call_timeout == 2);
  CHECK(t.close_timeout == 3);
  CHECK(t.keep_alive_interval == 1);
  CHECK(t.keep_alive_max_attempt == 9);
  CHECK(t.read_timeout == 11);
}

TEST_CASE("rdzv_timings: heartbeat_timeout sets the missed-heartbeat count", "[launcher][rdzv_conf]") {
  CHECK(rdzv_timings(Conf{{"heartbeat_timeout", "20"}}).keep_alive_max_attempt == 4);  // 20 / 5
  CHECK(rdzv_timings(Conf{{"heartbeat_timeout", "7"}, {"keep_alive_interval", "2"}}).keep_alive_max_attempt ==
        4);                                                                           // ceil(3.5)
  CHECK(rdzv_timings(Conf{{"heartbeat_timeout", "1"}}).keep_alive_max_attempt == 1);  // at least one
  // An explicit keep_alive_max_attempt wins.
  CHECK(rdzv_timings(Conf{{"heartbeat_timeout", "60"}, {"keep_alive_max_attempt", "2"}})
            .keep_alive_max_attempt == 2);
}

TEST_CASE("rdzv_timings: the static backend's timeout is the join timeout", "[launcher][rdzv_conf]") {
  CHECK(rdzv_timings(Conf{{"timeout", "45"}}).join_timeout == 45);
  CHECK(rdzv_timings(Conf{{"timeout", "45"}, {"join_timeout", "12"}}).join_timeout == 12);
}
