// Does the workers' Python interpreter run? Part of the preflight (launcher/preflight.h): a broken
// interpreter (a pyenv shim naming a version that is not installed, a venv or conda env whose libraries are
// gone, a wrong PYTHONHOME, a binary for another machine, a container wrapper that fails) is one line and
// exit 2 before the rendezvous, instead of every worker failing after it.
//
// The check runs `<exe> -S -c ''` with the agent's environment (the workers inherit it), stdin and stdout on
// /dev/null, stderr captured, under a deadline. -S (no site import) makes it cheaper; what it skips
// (site-packages .pth files) cannot keep an interpreter from starting.
//
// Cost: an interpreter start, 10-20 ms for CPython on an idle machine (far more behind a pyenv shim or a
// container wrapper). So a success is remembered: in <cache>/ddprun/interpreters-ok (<cache>: the
// environment's XDG_CACHE_HOME, else HOME/.cache), one line per verdict, a hash of what the start depends on:
// this host's name, the interpreter's path, the identity of the file it resolves to (device, inode, size,
// mtime, ctime), the working directory (pyenv reads .python-version from it) and every environment variable
// named PATH, LD_*, PYTHON*, PYENV*, CONDA*, VIRTUAL_ENV*. The same interpreter in the same setting is not
// run again (a stat and a small read). Only successes are remembered: a cached verdict can never refuse a
// launch, it can only miss a breakage that changed none of these (then the workers fail as they would have
// without the check). No cache directory, or a read-only one: every launch runs the check.
//
// Blocking: up to `deadline`; never throws.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::launcher {

// How long the interpreter may take. Past it the check is given up with a warning on stderr (a slow start is
// not a broken interpreter) and the launch goes on.
inline constexpr std::chrono::milliseconds kInterpreterDeadline{5000};

struct InterpreterCheck {
  std::string exe;                         // absolute path (as agent::find_program found it)
  std::string shown;                       // how the user named it (--python), for the message
  std::map<std::string, std::string> env;  // the agent's environment
  std::string cwd;
  std::chrono::milliseconds deadline = kInterpreterDeadline;
  bool use_cache = true;
};

// nullopt when the interpreter runs (or its success is remembered, or it outlived the deadline); otherwise
// one line for the user: what ran, how it ended (exit code, signal, or why it could not be executed), the
// telling line of its stderr ("Fatal Python error: ..." when there is one, else its last line) and what to
// do.
std::optional<std::string> interpreter_problem(const InterpreterCheck& check);

// Runs `check.exe args...` with check.env, stdin and stdout on /dev/null, and fills `err` with its stderr (64
// KiB at most). Returns the wait status, or -1 when it outlived check.deadline (killed and reaped), or
// -2 - errno when it could not be spawned.
int run_interpreter(const InterpreterCheck& check, const std::vector<std::string>& args, std::string& err);

// The cache key of a check (a 16-digit hex hash), "" when the interpreter's file cannot be stat'ed. Also the
// key of launcher/torch_version.h's answers.
std::string interpreter_cache_key(const InterpreterCheck& check);

// The launcher's cache file `name`: <cache>/ddprun/<name> (<cache>: env's XDG_CACHE_HOME, else HOME/.cache;
// absolute paths only), "" when there is none.
std::string cache_file(const std::map<std::string, std::string>& env, const std::string& name);

// Appends `line` to the cache file (creating its directories); past 32 KiB the file is rewritten (a temporary
// file renamed over it) with its newest 256 lines. Failures are ignored: the cache only saves time.
void remember(const std::string& file, const std::string& line);

}  // namespace ddprun::launcher
