// Unit tests of agent/file_timer: torch's FileTimer lines and the timer table (pure), and the server on a
// real FIFO written the way torch's FileTimerClient writes it (open, one line, close).
#include "agent/watchdog/file_timer.h"

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange under C++20

#include "catch_compat.h"

using namespace ddprun::agent;

TEST_CASE("torch's timer request lines are read, anything else is refused with a reason") {
  std::string error;
  auto r = parse_timer_request(
      R"({"version": 1, "pid": 4242, "scope_id": "load", "expiration_time": 1764000000.5, "signal": 9})",
      error);
  REQUIRE(r);
  CHECK(*r == TimerRequest{4242, "load", 1764000000.5, 9});
  CHECK(parse_timer_request(
            R"({"version": 1, "pid": 1, "scope_id": "x", "expiration_time": -1, "signal": 0})", error)
            ->expiration_time == -1);
  CHECK_FALSE(parse_timer_request("garbage", error));
  CHECK(error == "not a JSON object");
  CHECK_FALSE(
      parse_timer_request(R"({"pid": "1", "scope_id": "x", "expiration_time": 1, "signal": 9})", error));
  CHECK(error == "expected pid, scope_id, expiration_time and signal");
}

TEST_CASE("the timer table: release, expiry per pid with torch's choice of signal") {
  TimerTable t;
  t.apply({10, "a", 100, 0});
  t.apply({10, "b", 105, 15});
  t.apply({10, "c", 103, 9});
  t.apply({11, "a", 200, 9});
  t.apply({12, "x", 50, 9});
  t.apply({12, "x", -1, 0});  // released
  CHECK(t.size() == 4);
  CHECK(t.next_expiration() == 100);
  CHECK(t.take_expired(99).empty());
  auto expired = t.take_expired(110);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0] == TimerRequest{10, "c", 103, 9});  // the earliest with a signal
  CHECK(t.size() == 1);                                // every timer of pid 10 dropped
  t.apply({13, "nosig", 1, 0});
  expired = t.take_expired(300);
  REQUIRE(expired.size() == 2);
  CHECK(expired[1] == TimerRequest{13, "nosig", 1, 0});
  CHECK_FALSE(t.next_expiration());
}

TEST_CASE("the server reads clients' lines from its FIFO and reports the expired timer") {
  auto path = std::filesystem::temp_directory_path() / ("ddprun-timer-" + std::to_string(getpid()));
  boost::asio::io_context io;
  std::optional<TimerRequest> expired;
  {
    FileTimerServer server(io, path, [&](const TimerRequest& r) {
      expired = r;
      io.stop();
    });
    auto send = [&](const std::string& line) {
      int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);  // as FileTimerClient
      REQUIRE(fd >= 0);
      REQUIRE(::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
      ::close(fd);
    };
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    send(R"({"version": 1, "pid": 77, "scope_id": "step", "expiration_time": )" + std::to_string(now + 0.2) +
         R"(, "signal": 9})" + "\n");
    send("not json\n");
    send(R"({"version": 1, "pid": 78, "scope_id": "gone", "expiration_time": )" + std::to_string(now + 0.1) +
         R"(, "signal": 9})" + "\n" +
         R"({"version": 1, "pid": 78, "scope_id": "gone", "expiration_time": -1, "signal": 0})" + "\n");
    io.run_for(std::chrono::seconds(10));
    CHECK(server.requests() == 3);
  }
  REQUIRE(expired);
  CHECK(*expired == TimerRequest{77, "step", expired->expiration_time, 9});
  CHECK_FALSE(std::filesystem::exists(path));  // removed with the server
}
