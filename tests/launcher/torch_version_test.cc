// Unit tests of launcher/torch_version.h: the workers' torch version, asked of a fake interpreter (a shell
// script that answers like the probe) and remembered while its metadata directory exists; and what each
// version means for the workers (the NCCL variable torchrun sets, ddprun-launch's --local-rank spelling).
#include "launcher/torch_version.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "catch_compat.h"
#include "temp_dir.h"

using namespace ddprun::launcher;
using ddprun::testing::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr fs::perms kExec = fs::perms::owner_all;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("torch version: parsed from the package metadata's text", "[launcher][torch_version]") {
  auto v = parse_torch_version("2.6.0+debian");
  REQUIRE(v);
  CHECK((v->major == 2 && v->minor == 6 && v->text == "2.6.0+debian"));
  v = parse_torch_version("1.13.0a0+gitunknown");
  REQUIRE(v);
  CHECK((v->major == 1 && v->minor == 13));
  CHECK(parse_torch_version("2.11.0.dev20260101+cu130")->minor == 11);
  CHECK_FALSE(parse_torch_version("nightly"));
  CHECK_FALSE(parse_torch_version("2"));
  CHECK_FALSE(parse_torch_version(""));
}

TEST_CASE("torch version: what torchrun of that version gives its workers", "[launcher][torch_version]") {
  CHECK(nccl_async_error_handling_var(parse_torch_version("1.13.1")) == "NCCL_ASYNC_ERROR_HANDLING");
  CHECK(nccl_async_error_handling_var(parse_torch_version("2.1.2")) == "NCCL_ASYNC_ERROR_HANDLING");
  CHECK(nccl_async_error_handling_var(parse_torch_version("2.2.0")) == "TORCH_NCCL_ASYNC_ERROR_HANDLING");
  CHECK(nccl_async_error_handling_var(parse_torch_version("2.6.0")) == "TORCH_NCCL_ASYNC_ERROR_HANDLING");
  CHECK(nccl_async_error_handling_var(std::nullopt) == "TORCH_NCCL_ASYNC_ERROR_HANDLING");
  CHECK(local_rank_arg(parse_torch_version("1.13.1")) == "--local_rank");
  CHECK(local_rank_arg(parse_torch_version("2.0.0")) == "--local-rank");
  CHECK(local_rank_arg(std::nullopt) == "--local-rank");
}

TEST_CASE("torch version: asked once per interpreter setting, again once its torch is gone",
          "[launcher][torch_version]") {
  TempDir dir;
  const fs::path meta = dir.path / "torch-2.6.0.dist-info", runs = dir.path / "runs";
  fs::create_directories(meta);
  // Answers as the probe does (on stderr), after a warning line of the kind Python may print first.
  const auto py = dir.write("py",
                            "#!/bin/sh\necho run >> " + runs.string() +
                                "\necho 'some warning' >&2\n"
                                "[ -n \"$NO_TORCH\" ] && exit 0\n"
                                "echo \"ddprun-torch: ${TORCH_VERSION:-2.6.0} ${TORCH_META:-" +
                                meta.string() + "}\" >&2\n",
                            kExec);
  const std::map<std::string, std::string> env{{"PATH", "/usr/bin:/bin"},
                                               {"XDG_CACHE_HOME", (dir.path / "cache").string()}};
  auto count = [&] {
    const std::string text = read_file(runs);
    return std::count(text.begin(), text.end(), '\n');
  };
  auto v = probe_torch_version(py.string(), env, dir.path.string());
  REQUIRE(v);
  CHECK(v->text == "2.6.0");
  CHECK(count() == 1);
  CHECK(probe_torch_version(py.string(), env, dir.path.string())->text == "2.6.0");
  CHECK(count() == 1);  // remembered
  // Another torch was installed: the remembered metadata directory is gone, the interpreter is asked again
  // (and, while the directory it names is missing, every time).
  fs::remove_all(meta);
  const fs::path meta2 = dir.path / "torch-1.13.1.egg-info";
  auto env2 = env;
  env2["TORCH_VERSION"] = "1.13.1";  // not settings the key covers: only the directory tells
  env2["TORCH_META"] = meta2.string();
  CHECK(probe_torch_version(py.string(), env2, dir.path.string())->text == "1.13.1");
  CHECK(probe_torch_version(py.string(), env2, dir.path.string())->text == "1.13.1");
  CHECK(count() == 3);
  fs::create_directories(meta2);
  CHECK(probe_torch_version(py.string(), env2, dir.path.string())->text == "1.13.1");
  CHECK(probe_torch_version(py.string(), env2, dir.path.string())->text == "1.13.1");
  CHECK(count() == 4);
  auto no_torch = env;
  no_torch["PYTHONPATH"] = "/elsewhere";  // a setting that steers Python: asked anew
  no_torch["NO_TORCH"] = "1";
  CHECK_FALSE(probe_torch_version(py.string(), no_torch, dir.path.string()));
  CHECK_FALSE(probe_torch_version(py.string(), no_torch, dir.path.string()));
  CHECK(count() == 6);  // no torch is never remembered
  CHECK_FALSE(probe_torch_version((dir.path / "missing").string(), env, dir.path.string()));
}
