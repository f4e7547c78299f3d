// Unit tests of ddprun/state.h (the C++ worker API of the training state, docs/state.md "The C++ API") as
// one process alone (sdk::init() without RANK: no store, nothing to agree with), in a temporary directory
// given as $DDPRUN_STATE_DIR; and of the agreement (worker_sdk/src/state_agreement.h) with ranks as threads
// on a store on port 0. A writer killed in the middle of a save is a forked child over its file size limit.
#include "ddprun/state.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "catch_compat.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/util/state_format.h"
#include "worker_sdk/src/state_agreement.h"
#include "worker_sdk/state_dir.h"

namespace fs = std::filesystem;
namespace sdk = ddprun::sdk;
namespace state = ddprun::sdk::state;
using ddprun::sdk::testing::StateDir;
using namespace std::chrono_literals;

namespace {

std::vector<state::Buffer> buffers(const std::vector<float>& w, const std::vector<int64_t>& n) {
  return {{"model.weight", "float32", {2, static_cast<int64_t>(w.size() / 2)}, "cpu", w.data(), 4 * w.size()},
          {"step count", "int64", {}, "cuda:1", n.data(), 8}};
}

std::vector<float> values(float base, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

std::vector<float> floats(const state::TensorView& t) {
  std::vector<float> out(t.nbytes / 4);
  std::memcpy(out.data(), t.data, t.nbytes);
  return out;
}

}  // namespace

TEST_CASE("state: a saved version loads back, named, with its manifest's writer c++", "[worker_sdk][state]") {
  StateDir d;
  const auto w = values(1.5f, 6);
  const std::vector<int64_t> n{42};
  REQUIRE(state::enabled());
  REQUIRE(state::save(5, buffers(w, n)));
  CHECK(d.files() == std::vector<std::string>{"rank0.step5.ddps"});

  auto ctx = sdk::init();
  auto v = state::load(*ctx);
  REQUIRE(v.has_value());
  CHECK(state::why_none().empty());
  CHECK(v->step() == 5);
  CHECK(v->attempt() == 0);
  CHECK(v->writer() == "c++");
  REQUIRE(v->tensors().size() == 2);
  const state::TensorView* t = v->find("model.weight");
  REQUIRE(t != nullptr);
  CHECK(t->dtype == "float32");
  CHECK(t->shape == std::vector<int64_t>{2, 3});
  CHECK(t->device == "cpu");
  CHECK(floats(*t) == w);
  CHECK(reinterpret_cast<uintptr_t>(t->data) % ddprun::kStateAlign == 0);
  const state::TensorView* s = v->find("step count");  // a name with a space: to the end of the line
  REQUIRE(s != nullptr);
  CHECK(s->shape.empty());
  CHECK(s->device == "cuda:1");
  CHECK(*static_cast<const int64_t*>(s->data) == 42);
  CHECK(v->find("absent") == nullptr);

  // The views live as long as any copy of the Version (the mapping is shared).
  const state::Version copy = *v;
  v.reset();
  CHECK(floats(*copy.find("model.weight")) == w);
}

TEST_CASE("state: two newest versions kept; async saves copy, write on a thread, rethrow nothing",
          "[worker_sdk][state]") {
  StateDir d;
  const std::vector<int64_t> n{0};
  auto w = values(0, 64);
  for (int64_t step : {1, 2, 3}) {
    w[0] = static_cast<float>(step);
    REQUIRE(state::save(step, buffers(w, n)));
  }
  CHECK(d.files() == std::vector<std::string>{"rank0.step2.ddps", "rank0.step3.ddps"});
  for (int64_t step : {4, 5}) {
    w[0] = static_cast<float>(step);
    REQUIRE(state::save(step, buffers(w, n), /*async=*/true));
    w[0] = -1;  // written after save() returned: the version has the value at the call
  }
  state::wait();
  // As Python's: an async save prunes to two before it writes, so three stay after it commits.
  CHECK(d.files() == std::vector<std::string>{"rank0.step3.ddps", "rank0.step4.ddps", "rank0.step5.ddps"});
  auto ctx = sdk::init();
  auto v = state::load(*ctx);
  REQUIRE(v.has_value());
  CHECK(v->step() == 5);
  CHECK(floats(*v->find("model.weight"))[0] == 5.0f);
}

TEST_CASE("state: a version over the quota is refused with the --state_memory to give",
          "[worker_sdk][state]") {
  StateDir d(/*quota=*/64 << 10);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  const std::vector<int64_t> n{0};
  const auto small = values(0, 1024);  // 4 KiB
  REQUIRE(state::save(1, buffers(small, n)));
  const auto big = values(0, 100 << 10);  // 400 KiB
  for (bool async : {false, true}) {
    try {
      state::save(2, buffers(big, n), async);
      FAIL("no StateMemoryError");
    } catch (const state::StateMemoryError& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("save(step=2): rank 0's version takes 0.4 MiB"));
      CHECK_THAT(what, Catch::Contains("each of this node's 2 local ranks 0.1 MiB"));
      CHECK_THAT(what, Catch::Contains("Start ddprun with --state_memory 5M or more"));
    }
  }
  CHECK(d.files() == std::vector<std::string>{"rank0.step1.ddps"});  // nothing of step 2, no temporary file
  ::unsetenv("LOCAL_WORLD_SIZE");
}

TEST_CASE("state: buffers that do not describe themselves are refused before anything is written",
          "[worker_sdk][state]") {
  StateDir d;
  const auto w = values(0, 6);
  const std::vector<int64_t> n{0};
  auto b = buffers(w, n);
  b[0].dtype = "float31";
  CHECK_THROWS_AS(state::save(1, b), std::invalid_argument);
  b = buffers(w, n);
  b[0].nbytes = 20;  // shape 2x3 of float32 is 24
  CHECK_THROWS_AS(state::save(1, b), std::invalid_argument);
  b = buffers(w, n);
  b[1].name = b[0].name;
  CHECK_THROWS_AS(state::save(1, b), std::invalid_argument);
  b = buffers(w, n);
  b[1].name = "two\nlines";
  CHECK_THROWS_AS(state::save(1, b), std::invalid_argument);
  CHECK_THROWS_AS(state::save(-1, buffers(w, n)), std::invalid_argument);
  CHECK(d.files().empty());
}

TEST_CASE("state: outside a job with --state_memory nothing is saved or loaded", "[worker_sdk][state]") {
  ::unsetenv("DDPRUN_STATE_DIR");
  const auto w = values(0, 6);
  const std::vector<int64_t> n{0};
  CHECK_FALSE(state::enabled());
  CHECK_FALSE(state::save(1, buffers(w, n)));
  auto ctx = sdk::init();
  CHECK_FALSE(state::load(*ctx).has_value());
  CHECK(state::why_none() == "this worker runs without ddprun --state_memory");
}

TEST_CASE("state: load says why there is none, skips what it cannot read", "[worker_sdk][state]") {
  StateDir d;
  auto ctx = sdk::init();
  CHECK_FALSE(state::load(*ctx).has_value());
  CHECK(state::why_none() == "rank 0 has no version on this node");

  const auto w = values(0, 6);
  const std::vector<int64_t> n{0};
  REQUIRE(state::save(3, buffers(w, n)));
  std::ofstream(d.dir / "rank0.step9.ddps") << "not a version";  // newer, unreadable: passed over
  auto v = state::load(*ctx);
  REQUIRE(v.has_value());
  CHECK(v->step() == 3);
  CHECK(d.files() == std::vector<std::string>{"rank0.step3.ddps"});  // newer than the agreed step: deleted

  // A job of another world size: no resharding.
  ::setenv("WORLD_SIZE", "2", 1);
  REQUIRE(state::save(4, buffers(w, n)));
  ::unsetenv("WORLD_SIZE");
  fs::remove(d.dir / "rank0.step3.ddps");
  CHECK_FALSE(state::load(*ctx).has_value());
  CHECK(state::why_none() ==
        "the state was saved by a job of 2 ranks and this one has 1: ddprun.state does not reshard");
}

TEST_CASE("state: a writer killed in the middle of its save leaves nothing that loads",
          "[worker_sdk][state]") {
  StateDir d;
  const auto w = values(0, 64 << 10);  // 256 KiB
  const std::vector<int64_t> n{0};
  REQUIRE(state::save(10, buffers(w, n)));
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const rlimit no_core{0, 0}, small{4096, 4096};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::setrlimit(RLIMIT_FSIZE, &small);  // the write past 4 KiB kills it: SIGXFSZ
    state::save(20, buffers(w, n));
    std::_Exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGXFSZ);
  const auto files = d.files();
  REQUIRE(files.size() == 2);
  CHECK(files[0] == ".rank0.step20." + std::to_string(child) + ".tmp");
  CHECK(fs::file_size(d.dir / files[0]) == 4096);
  CHECK(files[1] == "rank0.step10.ddps");
  auto ctx = sdk::init();
  auto v = state::load(*ctx);
  REQUIRE(v.has_value());
  CHECK(v->step() == 10);
}

TEST_CASE("state agreement: the newest step every rank has, or why none", "[worker_sdk][state]") {
  using state::StepAttempt;
  ddprun::rdzv::StoreServerThread server(ddprun::rdzv::StoreServerOptions{.host = "127.0.0.1"});
  auto run = [&](const std::vector<std::vector<StepAttempt>>& mine, const std::vector<std::string>& why,
                 int call) {
    const int world = static_cast<int>(mine.size());
    std::vector<state::Agreement> out(world);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r] {
        ddprun::rdzv::StoreClient store("127.0.0.1", server.port(), {.connect_timeout = 10s, .timeout = 60s});
        out[r] = state::agree(store, call, mine[r], world, why[r], 60s);
      });
    }
    for (auto& t : ranks) t.join();
    return out;
  };
  // Rank 1 never committed step 20; rank 2's step 20 is of another attempt: 10 (attempt 0) for everyone.
  auto a = run({{{10, 0}, {20, 1}}, {{10, 0}}, {{10, 0}, {20, 0}}}, {"", "", ""}, 1);
  for (const auto& r : a) {
    REQUIRE(r.agreed.has_value());
    CHECK(*r.agreed == StepAttempt{10, 0});
  }
  // A rank without any version (a first start) and its reason: none for anyone, the reason said.
  a = run({{{10, 0}}, {}}, {"", "rank 1 has no version on this node"}, 2);
  for (const auto& r : a) {
    CHECK_FALSE(r.agreed.has_value());
    CHECK(r.why == "rank 1 has no version on this node");
  }
  a = run({{{10, 0}}, {{20, 0}}}, {"", ""}, 3);
  CHECK(a[0].why == "no step that every rank committed");
  // Alone: the newest.
  CHECK(*state::agree_alone({{3, 0}, {7, 1}, {7, 0}}, "").agreed == StepAttempt{7, 1});
  CHECK(state::agree_alone({}, "why").why == "why");
}
