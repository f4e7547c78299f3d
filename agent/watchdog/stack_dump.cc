#include "agent/watchdog/stack_dump.h"

#include <algorithm>
#include <regex>
#include <sstream>

#include "rendezvous/util/text_util.h"

namespace ddprun::agent {
namespace {

struct Thread {
  bool main = false;     // gdb's Thread 1, or faulthandler's thread with a "<module>" frame
  bool current = false;  // faulthandler's "Current thread"
  Stack frames;
};

int to_int(const std::string& s) {
  return parse_int_in<int>(s, 0, INT32_MAX).value_or(0);
}

// Every thread of the last dump in `text`: a new dump starts where a thread header follows non-dump lines.
std::vector<Thread> parse_threads(std::string_view text) {
  static const std::regex kPyThread(
      R"re(^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):\s*$)re");
  static const std::regex kPyFrame(R"re(^\s+File "(.*)", line (\d+) in (.*?)\s*$)re");
  static const std::regex kGdbThread(R"re(^Thread (\d+) \(.*\):\s*$)re");
  static const std::regex kGdbFrame(
      R"re(^#\d+\s+(?:0x[0-9a-fA-F]+ in )?(\S+) \(.*?\)(?: at (.*):(\d+)| from (\S+))?\s*$)re");
  std::vector<Thread> threads;
  bool in_dump = false;
  std::istringstream in{std::string(text)};
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_match(line, m, kPyThread) || std::regex_match(line, m, kGdbThread)) {
      if (!in_dump) threads.clear();  // an earlier dump: only the last one counts
      in_dump = true;
      Thread t;
      t.current = m[1] == "Current thread";
      t.main = m[1] == "1";
      threads.push_back(std::move(t));
    } else if (in_dump && std::regex_match(line, m, kPyFrame)) {
      threads.back().frames.push_back({m[3], m[1], to_int(m[2])});
      if (m[3] == "<module>") threads.back().main = true;
    } else if (in_dump && std::regex_match(line, m, kGdbFrame)) {
      threads.back().frames.push_back({m[1], m[2].matched ? m[2].str() : m[4].str(), to_int(m[3])});
    } else if (in_dump && !line.empty() && line.rfind("  <", 0) != 0) {
      in_dump = false;  // the worker's own output again; "  <no Python frame>" and blank lines stay in
    }
  }
  return threads;
}

std::string base_name(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

Stack parse_stack_dump(std::string_view text) {
  auto threads = parse_threads(text);
  for (const auto& t : threads) {
    if (t.main) return t.frames;
  }
  for (const auto& t : threads) {
    if (t.current) return t.frames;
  }
  return threads.empty() ? Stack{} : threads.front().frames;
}

std::string frame_text(const StackFrame& f) {
  if (f.file.empty()) return f.function;
  return f.function + " (" + base_name(f.file) + (f.line > 0 ? ":" + std::to_string(f.line) : "") + ")";
}

std::vector<std::pair<Stack, std::vector<int>>> group_stacks(const std::map<int, Stack>& stacks_by_rank,
                                                             size_t depth) {
  std::map<Stack, std::vector<int>> groups;
  for (const auto& [rank, stack] : stacks_by_rank) {
    groups[Stack(stack.begin(), stack.begin() + static_cast<long>(std::min(depth, stack.size())))].push_back(
        rank);
  }
  std::vector<std::pair<Stack, std::vector<int>>> ordered(groups.begin(), groups.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() < b.second.size();
    return a.second.front() < b.second.front();
  });
  return ordered;
}

std::string summarize_stacks(const std::map<int, Stack>& stacks_by_rank, size_t depth) {
  std::string out;
  for (const auto& [top, ranks] : group_stacks(stacks_by_rank, depth)) {
    if (!out.empty()) out += " · ";
    out += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
    out += ": ";
    if (top.empty()) out += "(no stack)";
    for (size_t i = top.size(); i-- > 0;) out += frame_text(top[i]) + (i ? " → " : "");
  }
  return out;
}

std::string python_stack_hook() {
  return R"PY(# Written by ddprun (agent/watchdog/stack_dump.h). Dumps every thread's stack to stderr on the signal named by
# $DDPRUN_STACK_SIGNAL (faulthandler, standard library), so that ddprun can show where a hung rank is. Then it
# runs the sitecustomize module it shadows, if there is one.
import os as _os
import sys as _sys


def _ddprun_setup():
    here = _os.path.dirname(_os.path.abspath(__file__))
    try:
        import faulthandler
        signum = int(_os.environ.get("DDPRUN_STACK_SIGNAL", "0"))
        if signum > 0:
            faulthandler.register(signum, all_threads=True, chain=False)
    except Exception as e:  # never stop the worker for this
        print("ddprun: cannot install the stack dump handler: %s" % e, file=_sys.stderr)
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    import importlib.machinery
    import importlib.util
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _sys.path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        _sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_ddprun_setup()
del _ddprun_setup
)PY";
}

}  // namespace ddprun::agent
