// Where every rank is: reading the stacks that workers dump into their stderr logs, and the one-line summary
// that groups ranks by where they are.
//
// Two dump formats are read (the agent asks for them, see agent/watchdog/stack_capture.h):
//  - Python's faulthandler (every thread; the agent makes it dump on a signal, see python_stack_hook()):
//        Thread 0x00007f.. (most recent call first):
//          File "/x/train.py", line 7 in stuck_in_data_loading
//          File "/x/train.py", line 20 in <module>
//    ("Current thread 0x.." for the thread that ran the handler). The main thread is the one whose outermost
//    frame is "<module>"; without one, the current thread.
//  - gdb's `thread apply all bt` for native (C++) workers:
//        Thread 1 (Thread 0x7f.. (LWP 12) "prog"):
//        #0  0x00007f.. in __GI___clock_nanosleep (...) at ../sysdeps/x.c:78
//        #1  0x0000.. in stuck () at prog.cc:7
//    The main thread is "Thread 1"; a frame without "at file:line" keeps its library ("from /lib/x.so").
//
// Pure: text in, text out. Thread-safe. Never throws except std::bad_alloc.
#pragma once

#include <compare>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddprun::agent {

struct StackFrame {
  std::string function;  // "stuck_in_data_loading", "<module>", "DistributedDataParallel.forward"
  std::string file;      // as written in the dump (a path, maybe a library)
  int line = 0;          // 0 when unknown
  auto operator<=>(const StackFrame&) const = default;
};

// Innermost frame first. Empty when `text` holds no dump this parser knows.
using Stack = std::vector<StackFrame>;

// The main thread's stack of the last complete dump in `text` (faulthandler or gdb), or empty.
Stack parse_stack_dump(std::string_view text);

// "stuck_in_data_loading (train.py:7)": the function and the file's base name with the line.
std::string frame_text(const StackFrame& frame);

// Ranks grouped by their innermost `depth` frames (those frames, the ranks in order), smallest group first
// (the odd ones out), ties by lowest rank.
std::vector<std::pair<Stack, std::vector<int>>> group_stacks(const std::map<int, Stack>& stacks_by_rank,
                                                             size_t depth = 3);

// The groups of group_stacks() in one line, each group shown
// outermost to innermost: "rank 2: main (train.py:13) → stuck_in_data_loading (train.py:5) · ranks 0,1:
// main (train.py:15) → backward (_tensor.py:488)". A rank with an empty stack shows "(no stack)".
std::string summarize_stacks(const std::map<int, Stack>& stacks_by_rank, size_t depth = 3);

// The sitecustomize.py the agent puts first on a Python worker's PYTHONPATH: registers faulthandler (every
// thread, to stderr) on the signal named by $DDPRUN_STACK_SIGNAL, then imports the sitecustomize it shadows,
// if any, so the system's own still runs. Standard library only.
std::string python_stack_hook();

}  // namespace ddprun::agent
