// fake_worker: a stand-in for a training process, for agent tests. Standard library and POSIX only.
//
// Flags, applied in this order whatever their order on the command line:
//   --stamp FILE           append "start <attempt> <local rank> <unix ns>\n" to FILE (one write, O_APPEND);
//                          the time is CLOCK_REALTIME taken first thing in main(); <attempt> and <local
//                          rank> are $TORCHELASTIC_RESTART_COUNT and $LOCAL_RANK ("-" when unset)
//   --crash-on-attempt N   when TORCHELASTIC_RESTART_COUNT == N: local rank 0 waits (polling every 1 ms, 30 s
//                          at most) until the --stamp file holds $LOCAL_WORLD_SIZE "start N " lines, i.e. the
//                          whole local group runs, then appends "crash N 0 <unix ns>\n" to it and exits 1;
//                          without --stamp it exits 1 at once. The other local ranks sleep until a signal
//                          ends them (a group blocked in a collective). On other attempts: no effect
//   --record-signals FILE  handlers for TERM/INT/HUP/QUIT/USR1/USR2 append "<NAME>\n" to FILE and exit 128+N;
//                          "ready\n" is appended once they are installed
//   --ignore-sigterm       SIGTERM is ignored (overrides --record-signals for TERM)
//   --spawn-grandchild     fork a child that stays in this process group, ignores TERM/INT/HUP and sleeps
//                          forever; print "grandchild <pid>\n" on stdout (flushed)
//   --pidfile FILE         write "<own pid>\n" to FILE; written after the flags above, so it marks readiness
//   --dump-env FILE        write the environment as one JSON object {"KEY": "VALUE", ...}
//   --print-lines N        print N lines on stdout (--stderr: on stderr), buffered, then flush. Line i
//                          (0-based) is line_text(tag, i, line_bytes) below; --no-final-newline drops the
//                          last '\n'. --line-bytes M pads each line to M bytes (without '\n'); --tag STR
//                          starts each line
//   --sleep-ms N           sleep N ms
//   --error-file           write torch's @record error.json to $TORCHELASTIC_ERROR_FILE, then exit 1
//   --signal NAME|N        raise this signal on itself (no core dump); exit 99 if it survives
//   --hang                 sleep until a signal ends the process
//   --exit N               exit with N (default 0)
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

extern char** environ;

namespace {

struct Options {
  int exit_code = 0;
  std::string signal;
  bool hang = false;
  long sleep_ms = 0;
  long print_lines = 0;
  long line_bytes = 0;
  bool to_stderr = false;
  bool no_final_newline = false;
  std::string tag;
  std::string dump_env;
  std::string record_signals;
  bool ignore_sigterm = false;
  bool spawn_grandchild = false;
  std::string pidfile;
  bool error_file = false;
  std::string stamp;
  long crash_on_attempt = -1;
};

const struct {
  const char* name;
  int number;
} kSignals[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"ILL", SIGILL},  {"ABRT", SIGABRT},
                {"FPE", SIGFPE},   {"KILL", SIGKILL}, {"SEGV", SIGSEGV}, {"PIPE", SIGPIPE}, {"ALRM", SIGALRM},
                {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"BUS", SIGBUS}};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "fake_worker: " << why << "\n";
  std::exit(2);
}

int parse_signal(std::string s) {
  if (!s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) return std::stoi(s);
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  for (const auto& sig : kSignals) {
    if (s == sig.name) return sig.number;
  }
  usage("unknown signal " + s);
}

const char* signal_name(int sig) {
  for (const auto& s : kSignals) {
    if (s.number == sig) return s.name;
  }
  return "?";
}

// Line i of --print-lines: "<tag><i>:" then 'a'..'z' repeated up to line_bytes bytes in all.
std::string line_text(const std::string& tag, long i, long line_bytes) {
  std::string line = tag + std::to_string(i) + ":";
  for (long k = 0; static_cast<long>(line.size()) < line_bytes; ++k) line += static_cast<char>('a' + k % 26);
  return line;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

void append_to(const char* path, const char* text) {  // async-signal-safe
  const int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t ignored = ::write(fd, text, std::strlen(text));
  (void)ignored;
  ::close(fd);
}

const char* g_record_file = nullptr;

void record_and_exit(int sig) {
  char line[16] = {};
  std::strncpy(line, signal_name(sig), sizeof line - 2);
  line[std::strlen(line)] = '\n';
  append_to(g_record_file, line);
  ::_exit(128 + sig);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  if (!f.flush()) usage("cannot write " + path);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--exit") o.exit_code = std::stoi(value());
    else if (a == "--signal") o.signal = value();
    else if (a == "--hang") o.hang = true;
    else if (a == "--sleep-ms") o.sleep_ms = std::stol(value());
    else if (a == "--print-lines") o.print_lines = std::stol(value());
    else if (a == "--line-bytes") o.line_bytes = std::stol(value());
    else if (a == "--stderr") o.to_stderr = true;
    else if (a == "--no-final-newline") o.no_final_newline = true;
    else if (a == "--tag") o.tag = value();
    else if (a == "--dump-env") o.dump_env = value();
    else if (a == "--record-signals") o.record_signals = value();
    else if (a == "--ignore-sigterm") o.ignore_sigterm = true;
    else if (a == "--spawn-grandchild") o.spawn_grandchild = true;
    else if (a == "--pidfile") o.pidfile = value();
    else if (a == "--error-file") o.error_file = true;
    else if (a == "--stamp") o.stamp = value();
    else if (a == "--crash-on-attempt") o.crash_on_attempt = std::stol(value());
    else usage("unknown flag " + a);
  }
  return o;
}

// --crash-on-attempt: until `stamp` holds $LOCAL_WORLD_SIZE lines "start <attempt> ...", or 30 s passed.
void wait_for_group(const std::string& stamp, const std::string& attempt) {
  const char* size_env = std::getenv("LOCAL_WORLD_SIZE");
  const long size = size_env != nullptr ? std::atol(size_env) : 1;
  const std::string prefix = "start " + attempt + " ";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(stamp);
    long started = 0;
    for (std::string line; std::getline(f, line);) started += line.rfind(prefix, 0) == 0 ? 1 : 0;
    if (started >= size) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

int main(int argc, char** argv) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const long long start_ns = now.tv_sec * 1000000000LL + now.tv_nsec;
  const Options o = parse(argc, argv);

  const char* attempt_env = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const char* local_rank_env = std::getenv("LOCAL_RANK");
  const std::string attempt = attempt_env != nullptr ? attempt_env : "-";
  const std::string local_rank = local_rank_env != nullptr ? local_rank_env : "-";
  if (!o.stamp.empty()) {
    const std::string line = "start " + attempt + " " + local_rank + " " + std::to_string(start_ns) + "\n";
    append_to(o.stamp.c_str(), line.c_str());
  }
  if (o.crash_on_attempt >= 0 && attempt_env != nullptr && std::atol(attempt_env) == o.crash_on_attempt) {
    if (local_rank == "0") {
      if (!o.stamp.empty()) {
        wait_for_group(o.stamp, attempt);
        ::clock_gettime(CLOCK_REALTIME, &now);
        const std::string line =
            "crash " + attempt + " 0 " + std::to_string(now.tv_sec * 1000000000LL + now.tv_nsec) + "\n";
        append_to(o.stamp.c_str(), line.c_str());
      }
      return 1;
    }
    for (;;) ::pause();
  }

  if (!o.record_signals.empty()) {
    g_record_file = o.record_signals.c_str();
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::signal(sig, record_and_exit);
    append_to(g_record_file, "ready\n");
  }
  if (o.ignore_sigterm) ::signal(SIGTERM, SIG_IGN);
  if (o.spawn_grandchild) {
    std::fflush(stdout);
    const pid_t child = ::fork();
    if (child < 0) usage("fork failed");
    if (child == 0) {
      for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::signal(sig, SIG_IGN);
      for (;;) ::pause();
    }
    std::printf("grandchild %d\n", static_cast<int>(child));
    std::fflush(stdout);
  }
  if (!o.pidfile.empty()) write_file(o.pidfile, std::to_string(::getpid()) + "\n");
  if (!o.dump_env.empty()) {
    std::string json = "{";
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const size_t eq = entry.find('=');
      if (json.size() > 1) json += ", ";
      // Appended piece by piece: `"literal" + std::string&&` makes GCC 12 at -O3 warn falsely (-Wrestrict).
      json += '"';
      json += json_escape(entry.substr(0, eq));
      json += "\": \"";
      json += json_escape(eq == std::string::npos ? "" : entry.substr(eq + 1));
      json += '"';
    }
    write_file(o.dump_env, json + "}\n");
  }
  if (o.print_lines > 0) {
    FILE* out = o.to_stderr ? stderr : stdout;
    static char buffer[1 << 16];
    std::setvbuf(out, buffer, _IOFBF, sizeof buffer);
    for (long i = 0; i < o.print_lines; ++i) {
      const std::string line = line_text(o.tag, i, o.line_bytes);
      std::fwrite(line.data(), 1, line.size(), out);
      if (i + 1 < o.print_lines || !o.no_final_newline) std::fputc('\n', out);
    }
    std::fflush(out);
  }
  if (o.sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.sleep_ms));
  if (o.error_file) {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (path == nullptr) usage("--error-file: TORCHELASTIC_ERROR_FILE is not set");
    const std::string json = "{\"message\": {\"message\": \"RuntimeError: fake_worker failed on purpose\", "
                             "\"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n  File "
                             "\\\"fake_worker\\\", line 1, in <module>\\nRuntimeError: fake_worker failed on "
                             "purpose\\n\", \"timestamp\": \"" +
                             std::to_string(std::time(nullptr)) + "\"}}}\n";
    write_file(path, json);
    return 1;
  }
  if (!o.signal.empty()) {
    const int sig = parse_signal(o.signal);
    rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
    ::raise(sig);
    return 99;
  }
  if (o.hang) {
    for (;;) ::pause();
  }
  return o.exit_code;
}
