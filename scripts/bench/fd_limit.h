// Raises this process's soft descriptor limit (RLIMIT_NOFILE) to the hard one: the benchmarks open thousands
// of connections (the hard limit is about 20,000 here; only a privileged process may raise it).
#pragma once

#include <sys/resource.h>

namespace ddprun::bench {

inline void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace ddprun::bench
