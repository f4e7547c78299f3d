// Unit tests of rendezvous/util/state_format.h: the version files of --state_memory, as the agent and the SDK
// read them (the Python writer's files are read by the same reader in tests/integration/test_state.py).
#include "rendezvous/util/state_format.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "catch_compat.h"

using ddprun::Manifest;
using ddprun::VersionName;

namespace {

Manifest sample() {
  Manifest m;
  m.step = 1200;
  m.attempt = 3;
  m.rank = 7;
  m.world_size = 16;
  m.payload = 4096 + 64;
  m.writer = "c++";
  m.tensors.push_back({.offset = 0,
                       .nbytes = 4096,
                       .dtype = "float32",
                       .shape = {32, 32},
                       .device = "cpu",
                       .name = "layer 0.weight"});
  m.tensors.push_back(
      {.offset = 4096, .nbytes = 4, .dtype = "int32", .shape = {}, .device = "cuda:1", .name = ""});
  m.pickle = std::pair<uint64_t, uint64_t>{4100, 60};
  return m;
}

// A file of `payload` bytes then `trailer`, in a temporary directory; returns the open fd.
int version_file(const std::string& payload, const std::string& trailer) {
  char path[] = "/tmp/ddprun-state-format-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::unlink(path);
  const std::string all = payload + trailer;
  REQUIRE(::write(fd, all.data(), all.size()) == static_cast<ssize_t>(all.size()));
  return fd;
}

}  // namespace

TEST_CASE("version file names: rank<R>.step<S>.ddps, plain decimals", "[state]") {
  CHECK(ddprun::version_file_name({3, 1200}) == "rank3.step1200.ddps");
  CHECK(ddprun::parse_version_file_name("rank3.step1200.ddps") == VersionName{3, 1200});
  CHECK(ddprun::parse_version_file_name("rank0.step0.ddps") == VersionName{0, 0});
  for (const char* bad : {"rank3.step1200.ddps.tmp", ".rank3.step1200.99.tmp", "rank03.step1.ddps",
                          "rank3.step01.ddps", "rank-1.step1.ddps", "rank3.ste1.ddps", "rank3.step.ddps",
                          "rankx.step1.ddps", "rank3.step1", "rank99999999999.step1.ddps"}) {
    CAPTURE(bad);
    CHECK_FALSE(ddprun::parse_version_file_name(bad).has_value());
  }
  CHECK(ddprun::is_temporary_state_file(".rank3.step1200.4242.tmp"));
  CHECK_FALSE(ddprun::is_temporary_state_file("rank3.step1200.ddps"));
  CHECK_FALSE(ddprun::is_temporary_state_file(".tmp"));
}

TEST_CASE("a manifest reads back as written", "[state]") {
  const Manifest m = sample();
  const std::string text = ddprun::manifest_text(m);
  CHECK(text ==
        "ddprun-state 1\nstep 1200\nattempt 3\nrank 7\nworld_size 16\npayload 4160\nwriter c++\n"
        "tensor 0 4096 float32 32x32 cpu layer 0.weight\ntensor 4096 4 int32 - cuda:1\npickle 4100 60\n");
  std::string why;
  const auto back = ddprun::parse_manifest(text, why);
  REQUIRE(back.has_value());
  CHECK(back->step == 1200);
  CHECK(back->attempt == 3);
  CHECK(back->rank == 7);
  CHECK(back->world_size == 16);
  CHECK(back->writer == "c++");
  REQUIRE(back->tensors.size() == 2);
  CHECK(back->tensors[0].name == "layer 0.weight");
  CHECK(back->tensors[0].shape == std::vector<int64_t>{32, 32});
  CHECK(back->tensors[1].shape.empty());
  CHECK(back->tensors[1].device == "cuda:1");
  CHECK(back->pickle == std::pair<uint64_t, uint64_t>{4100, 60});
}

TEST_CASE("a manifest is read tolerantly: unknown keys skipped, anything else unreadable refused",
          "[state]") {
  std::string why;
  const std::string head = "ddprun-state 1\nstep 5\nrank 0\nworld_size 2\npayload 100\n";
  CHECK(ddprun::parse_manifest(head + "future_key whatever it says\n", why).has_value());
  struct Bad {
    std::string text, reason;
  };
  for (const Bad& bad : {Bad{"ddprun-state 2\n", "does not start"},
                         Bad{"step 5\nrank 0\nworld_size 2\npayload 100\n", "does not start"},
                         Bad{"ddprun-state 1\nrank 0\nworld_size 2\npayload 100\n", "lacks"},
                         Bad{head + "step -1\n", "unreadable manifest line 'step -1'"},
                         Bad{head + "tensor 0 8 float99 2 cpu\n", "unreadable"},
                         Bad{head + "tensor 0 8 float32 2xq cpu\n", "unreadable"},
                         Bad{head + "tensor 0 8 float32\n", "unreadable"},
                         Bad{head + "tensor 96 8 float32 2 cpu\n", "outside the payload"},
                         Bad{head + "tensor 18446744073709551615 8 float32 2 cpu\n", "unreadable"},
                         Bad{head + "pickle 90 11\n", "outside the payload"}}) {
    CAPTURE(bad.text);
    why.clear();
    CHECK_FALSE(ddprun::parse_manifest(bad.text, why).has_value());
    CHECK(why.find(bad.reason) != std::string::npos);
  }
}

TEST_CASE("read_manifest: the trailer of a whole file, checked against its size", "[state]") {
  const Manifest m = sample();
  const std::string payload(m.payload, 'x');
  std::string why;
  {
    const int fd = version_file(payload, ddprun::manifest_trailer(m));
    const auto got = ddprun::read_manifest(fd, payload.size() + ddprun::manifest_trailer(m).size(), why);
    ::close(fd);
    REQUIRE(got.has_value());
    CHECK(got->step == 1200);
  }
  {
    // A payload shorter than the manifest says (a truncated copy): refused.
    const int fd = version_file(payload.substr(1), ddprun::manifest_trailer(m));
    const uint64_t size = payload.size() - 1 + ddprun::manifest_trailer(m).size();
    CHECK_FALSE(ddprun::read_manifest(fd, size, why).has_value());
    CHECK(why.find("does not fit") != std::string::npos);
    ::close(fd);
  }
  {
    // No magic at the end (a temporary file cut short): refused.
    std::string trailer = ddprun::manifest_trailer(m);
    trailer.back() = '?';
    const int fd = version_file(payload, trailer);
    CHECK_FALSE(ddprun::read_manifest(fd, payload.size() + trailer.size(), why).has_value());
    CHECK(why.find("magic") != std::string::npos);
    ::close(fd);
  }
  {
    const int fd = version_file("", "short");
    CHECK_FALSE(ddprun::read_manifest(fd, 5, why).has_value());
    CHECK(why.find("too short") != std::string::npos);
    ::close(fd);
  }
}

TEST_CASE("dtype sizes and shapes", "[state]") {
  CHECK(ddprun::dtype_bytes("bfloat16") == uint64_t{2});
  CHECK(ddprun::dtype_bytes("complex128") == uint64_t{16});
  CHECK_FALSE(ddprun::dtype_bytes("torch.float32").has_value());
  CHECK(ddprun::shape_text({}) == "-");
  CHECK(ddprun::shape_text({0, 3}) == "0x3");
  CHECK(ddprun::parse_shape("0x3") == std::vector<int64_t>{0, 3});
  CHECK_FALSE(ddprun::parse_shape("").has_value());
  CHECK_FALSE(ddprun::parse_shape("3x").has_value());
  CHECK(ddprun::state_aligned(1) == 64);
  CHECK(ddprun::state_aligned(64) == 64);
  CHECK(ddprun::state_aligned(0) == 0);
}
