// The main() of every Catch2 test executable (library ddprun_catch_main), for Catch2 v2 and v3 alike.
#if DDPRUN_CATCH2_MAJOR >= 3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char* argv[]) {
  return Catch::Session().run(argc, argv);
}
