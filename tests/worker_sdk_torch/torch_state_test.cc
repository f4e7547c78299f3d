// ddprun/torch_state.h as one process alone (no store) in a temporary $DDPRUN_STATE_DIR: named tensors round
// trip with their dtypes and values; a module and an optimizer (SGD with momentum, Adam) restored into fresh
// ones continue bit for bit as the originals; what cannot be saved or restored is refused by name.
#include "ddprun/torch_state.h"

#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "catch_compat.h"
#include "worker_sdk/state_dir.h"

namespace fs = std::filesystem;
namespace state = ddprun::sdk::state;
using ddprun::sdk::testing::StateDir;

namespace {

// One step of regression on fixed data.
void train_step(torch::nn::Linear& model, torch::optim::Optimizer& opt, int i) {
  torch::manual_seed(100 + i);
  const auto x = torch::randn({8, 4});
  opt.zero_grad();
  torch::mse_loss(model->forward(x), x.sum(1, true)).backward();
  opt.step();
}

template <class Opt, class Options>
void check_resumes_bitwise(const Options& options) {
  StateDir d;
  torch::manual_seed(7);
  torch::nn::Linear a(4, 1);
  Opt opt_a(a->parameters(), options);
  for (int i = 0; i < 3; ++i) train_step(a, opt_a, i);
  state::NamedTensors t;
  state::add_module(t, *a);
  state::add_optimizer(t, opt_a);
  REQUIRE(state::save(2, t, /*async=*/true));

  torch::manual_seed(8);  // other initial weights, fresh optimizer state
  torch::nn::Linear b(4, 1);
  Opt opt_b(b->parameters(), options);
  auto ctx = ddprun::sdk::init();
  auto got = state::load_tensors(*ctx);
  REQUIRE(got.has_value());
  CHECK(got->step == 2);
  state::restore_module(*b, got->tensors);
  state::restore_optimizer(opt_b, got->tensors);
  for (int i = 3; i < 6; ++i) {
    train_step(a, opt_a, i);
    train_step(b, opt_b, i);
  }
  CHECK(torch::equal(a->weight, b->weight));
  CHECK(torch::equal(a->bias, b->bias));
}

}  // namespace

TEST_CASE("torch_state: named tensors of every dtype come back by name, equal", "[torch_state]") {
  StateDir d;
  const state::NamedTensors saved = {
      {"f32", torch::arange(6, torch::kFloat32).reshape({2, 3})},
      {"bf16", torch::arange(4, torch::kFloat32).to(torch::kBFloat16)},
      {"i64 scalar", torch::tensor(int64_t{5})},
      {"bool", torch::tensor({true, false, true})},
      {"transposed", torch::arange(6, torch::kFloat64).reshape({2, 3}).t()},  // saved contiguous
      {"empty", torch::zeros({0, 4})},
  };
  REQUIRE(state::save(11, saved));
  auto ctx = ddprun::sdk::init();
  auto got = state::load_tensors(*ctx);
  REQUIRE(got.has_value());
  CHECK(got->step == 11);
  REQUIRE(got->tensors.size() == saved.size());
  for (const auto& [name, t] : saved) {
    INFO(name);
    const at::Tensor& back = got->tensors.at(name);
    CHECK(back.scalar_type() == t.scalar_type());
    CHECK(back.sizes() == t.sizes());
    CHECK(torch::equal(back, t));
  }
  // Backed by a private mapping: a write changes the tensor, not the file.
  got->tensors.at("f32").fill_(-1);
  auto again = state::load_tensors(*ctx);
  REQUIRE(again.has_value());
  CHECK(torch::equal(again->tensors.at("f32"), saved[0].second));
  CHECK(state::dtype_name(torch::kFloat16) == "float16");
  CHECK(state::scalar_type("complex64") == torch::kComplexFloat);
  CHECK_FALSE(state::scalar_type("float31").has_value());
}

TEST_CASE("torch_state: a module and SGD with momentum restored continue bit for bit", "[torch_state]") {
  check_resumes_bitwise<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9));
}

TEST_CASE("torch_state: a module and Adam restored continue bit for bit", "[torch_state]") {
  check_resumes_bitwise<torch::optim::Adam>(torch::optim::AdamOptions(0.01));
}

TEST_CASE("torch_state: what cannot be saved or restored is refused by name", "[torch_state]") {
  StateDir d;
  CHECK_THROWS_WITH(state::save(1, state::NamedTensors{{"u", at::Tensor()}}), Catch::Contains("tensor 'u'"));
  CHECK_THROWS_WITH(state::save(1, state::NamedTensors{{"s", torch::ones({2}).to_sparse()}}),
                    Catch::Contains("not a dense tensor"));
  torch::nn::Linear small(2, 1), large(3, 1);
  state::NamedTensors t;
  state::add_module(t, *small);
  REQUIRE(state::save(1, t));
  auto ctx = ddprun::sdk::init();
  auto got = state::load_tensors(*ctx);
  REQUIRE(got.has_value());
  CHECK_THROWS_WITH(state::restore_module(*large, got->tensors),
                    Catch::Contains("'model.weight' was saved as float32 of shape [1, 2]"));
  CHECK_THROWS_WITH(state::restore_module(*small, got->tensors, "net."),
                    Catch::Contains("no tensor 'net.weight'"));
  torch::optim::SGD opt(small->parameters(), torch::optim::SGDOptions(0.1));
  CHECK_THROWS_WITH(state::restore_optimizer(opt, got->tensors), Catch::Contains("no tensor 'optimizer'"));
}
