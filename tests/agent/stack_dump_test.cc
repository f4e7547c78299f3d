// Unit tests of agent/stack_dump: reading faulthandler and gdb dumps (texts as torch 1.13 workers and gdb 13
// wrote them here) and the summary that groups ranks by where they are.
#include "agent/watchdog/stack_dump.h"

#include "catch_compat.h"

using namespace ddprun::agent;

namespace {

// A gloo DDP rank waiting in backward's all-reduce; a helper thread first (faulthandler lists every thread).
const char* kWaitingRank = R"(epoch 0 step 9
Thread 0x00007f94c1dff6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 975 in _bootstrap

Current thread 0x00007f94db99a040 (most recent call first):
  File "/usr/lib/python3/dist-packages/torch/autograd/__init__.py", line 197 in backward
  File "/usr/lib/python3/dist-packages/torch/_tensor.py", line 488 in backward
  File "/tmp/hang/hang_train.py", line 15 in main
  File "/tmp/hang/hang_train.py", line 19 in <module>
)";

const char* kSleepingRank = R"(Current thread 0x00007efc4a872040 (most recent call first):
  File "/tmp/hang/hang_train.py", line 5 in stuck_in_data_loading
  File "/tmp/hang/hang_train.py", line 13 in main
  File "/tmp/hang/hang_train.py", line 19 in <module>
)";

const char* kGdb = R"([Thread debugging using libthread_db enabled]
0x00007f313d4f1dd0 in __libc_pause () at ../sysdeps/unix/sysv/linux/pause.c:29

Thread 2 (Thread 0x7f3130dff6c0 (LWP 10821) "fake_worker"):
#0  0x00007f313d4a3f16 in __futex_abstimed_wait_common () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x00007f313d4a8a3b in start_thread () from /lib/x86_64-linux-gnu/libc.so.6

Thread 1 (Thread 0x7f313d841740 (LWP 10820) "fake_worker"):
#0  0x00007f313d4f1dd0 in __libc_pause () at ../sysdeps/unix/sysv/linux/pause.c:29
#1  0x000055f92f25dbb9 in main (argc=<optimized out>, argv=<optimized out>) at /work/main/tests/bin/fake_worker.cc:289
[Inferior 1 (process 10820) detached]
)";

}  // namespace

TEST_CASE("faulthandler: the main thread (the one running <module>) of the dump") {
  Stack s = parse_stack_dump(kWaitingRank);
  REQUIRE(s.size() == 4);
  CHECK(s[0] == StackFrame{"backward", "/usr/lib/python3/dist-packages/torch/autograd/__init__.py", 197});
  CHECK(s[3] == StackFrame{"<module>", "/tmp/hang/hang_train.py", 19});
  CHECK(frame_text(s[2]) == "main (hang_train.py:15)");
}

TEST_CASE("faulthandler: only the last dump counts, and output between dumps ends one") {
  std::string two = std::string(kWaitingRank) + "epoch 1 step 3\n" + kSleepingRank + "more output\n";
  Stack s = parse_stack_dump(two);
  REQUIRE_FALSE(s.empty());
  CHECK(s[0].function == "stuck_in_data_loading");
  CHECK(parse_stack_dump("no dump here\nTraceback (most recent call last):\n").empty());
}

TEST_CASE("gdb: thread 1's frames, with the file and line or the library") {
  Stack s = parse_stack_dump(kGdb);
  REQUIRE(s.size() == 2);
  CHECK(s[0] == StackFrame{"__libc_pause", "../sysdeps/unix/sysv/linux/pause.c", 29});
  CHECK(s[1] == StackFrame{"main", "/work/main/tests/bin/fake_worker.cc", 289});
  std::string lib_only =
      "Thread 1 (Thread 0x7f (LWP 1) \"p\"):\n#0  0x00007f in poll () from /lib/libc.so.6\n";
  CHECK(parse_stack_dump(lib_only) == Stack{{"poll", "/lib/libc.so.6", 0}});
  CHECK(frame_text({"poll", "/lib/libc.so.6", 0}) == "poll (libc.so.6)");
}

TEST_CASE("the summary names the odd rank out first, then the ranks that agree") {
  std::map<int, Stack> stacks{{0, parse_stack_dump(kWaitingRank)},
                              {1, parse_stack_dump(kWaitingRank)},
                              {2, parse_stack_dump(kSleepingRank)},
                              {3, {}}};
  CHECK(summarize_stacks(stacks) ==
        "rank 2: <module> (hang_train.py:19) → main (hang_train.py:13) → stuck_in_data_loading "
        "(hang_train.py:5)"
        " · rank 3: (no stack)"
        " · ranks 0,1: main (hang_train.py:15) → backward (_tensor.py:488) → backward (__init__.py:197)");
  CHECK(summarize_stacks({{0, parse_stack_dump(kSleepingRank)}}, 1) ==
        "rank 0: stuck_in_data_loading (hang_train.py:5)");
}

TEST_CASE(
    "the Python hook registers faulthandler on $DDPRUN_STACK_SIGNAL and chains the shadowed sitecustomize") {
  std::string hook = python_stack_hook();
  CHECK(hook.find("faulthandler.register(signum, all_threads=True") != std::string::npos);
  CHECK(hook.find("DDPRUN_STACK_SIGNAL") != std::string::npos);
  CHECK(hook.find("find_spec(\"sitecustomize\"") != std::string::npos);
}
