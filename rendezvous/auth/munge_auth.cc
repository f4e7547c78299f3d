#include "rendezvous/auth/munge_auth.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <thread>

#include "rendezvous/auth/munge_library.h"
#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

namespace {

// A libmunge context on `socket`, destroyed with it.
class Context {
 public:
  Context(const MungeLibrary& lib, const std::string& socket) : lib_(lib), ctx_(lib.ctx_create()) {
    if (!ctx_) throw std::runtime_error("libmunge: no memory for a context");
    if (!socket.empty() && lib.ctx_set(ctx_, MUNGE_OPT_SOCKET, socket.c_str()) != EMUNGE_SUCCESS) {
      const std::string error = lib.ctx_strerror(ctx_);
      lib.ctx_destroy(ctx_);
      throw std::runtime_error("libmunge refuses the socket " + socket + ": " + error);
    }
  }
  ~Context() { lib_.ctx_destroy(ctx_); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  munge_ctx_t get() const { return ctx_; }
  std::string error() const {
    const char* e = lib_.ctx_strerror(ctx_);
    return e ? e : "unknown error";
  }

 private:
  const MungeLibrary& lib_;
  munge_ctx_t ctx_;
};

const MungeLibrary& library() {
  std::string why;
  const MungeLibrary* lib = munge_library(why);
  if (!lib) throw std::runtime_error(why);
  return *lib;
}

std::string socket_name(const std::string& socket) {
  return socket.empty() ? std::string("munged's default socket (/run/munge/munge.socket.2)") : socket;
}

std::string sha256_hex(std::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("OpenSSL's SHA-256 failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

}  // namespace

MungeAuth::MungeAuth(std::string socket, std::string job, Use use, std::chrono::milliseconds retry_for)
    : socket_(std::move(socket)),
      job_(std::move(job)),
      job_digest_(sha256_hex(job_)),
      uid_(getuid()),
      use_(use),
      retry_for_(retry_for),
      answered_(use != Use::kFollowUnchecked) {}

std::string MungeAuth::what() const {
  return "a MUNGE credential of " + job_ + " (uid " + std::to_string(uid_) + ")";
}

std::string MungeAuth::payload(std::string_view role, std::string_view client_nonce,
                               std::string_view store_nonce) const {
  return auth_message({role, job_digest_, client_nonce, store_nonce});
}

std::string MungeAuth::proof(std::string_view role, std::string_view client_nonce,
                             std::string_view store_nonce) const {
  const MungeLibrary& lib = library();
  const std::string text = payload(role, client_nonce, store_nonce);
  Context ctx(lib, socket_);
  char* cred = nullptr;
  if (lib.encode(&cred, ctx.get(), text.data(), static_cast<int>(text.size())) != EMUNGE_SUCCESS) {
    std::free(cred);
    throw std::runtime_error("munged at " + socket_name(socket_) + " made no credential: " + ctx.error());
  }
  std::string out(cred);
  std::free(cred);
  return out;
}

bool MungeAuth::verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
                       std::string_view given, std::string& why) const noexcept {
  try {
    const MungeLibrary& lib = library();
    Context ctx(lib, socket_);
    void* data = nullptr;
    int length = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    const std::string cred(given);
    const munge_err_t err = lib.decode(cred.c_str(), ctx.get(), &data, &length, &uid, &gid);
    const std::string decoded =
        data ? std::string(static_cast<const char*>(data), static_cast<size_t>(length)) : "";
    std::free(data);
    if (err != EMUNGE_SUCCESS) {
      why = "a MUNGE credential that munged at " + socket_name(socket_) + " refuses: " + ctx.error() +
            (err == EMUNGE_CRED_INVALID ? " (made with another MUNGE key: a node of another cluster?)" : "");
      return false;
    }
    if (uid != uid_) {
      why = "a MUNGE credential of uid " + std::to_string(uid) + ", not of the job's user (uid " +
            std::to_string(uid_) + "): every agent of a job runs as the same user";
      return false;
    }
    if (decoded != payload(role, client_nonce, store_nonce)) {
      why = "a MUNGE credential made for another job or another connection (this side is " + job_ + ")";
      return false;
    }
    return true;
  } catch (const std::exception& e) {  // no libmunge, a socket libmunge refuses, no memory
    why = e.what();
    return false;
  }
}

std::string MungeAuth::check() const {
  try {
    const std::string n = nonce();
    if (n.empty()) return "no random bytes for a nonce (the system's random source failed)";
    std::string why;
    return verify("check", n, n, proof("check", n, n), why) ? "" : why;
  } catch (const std::runtime_error& e) {
    return e.what();
  }
}

std::string MungeAuth::ready_to_prove(std::chrono::steady_clock::time_point deadline) const {
  if (answered_) return "";
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto until = std::min(deadline, start + retry_for_);
  int tries = 0;
  std::string why;
  while (true) {
    ++tries;
    why = check();
    if (why.empty()) {
      answered_ = true;
      return "";
    }
    if (Clock::now() + std::chrono::milliseconds(500) > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  return why + " (checked " + std::to_string(tries) + " time(s) over " + std::to_string(waited.count()) +
         " ms)";
}

std::string slurm_munge_socket(const std::filesystem::path& slurm_conf) {
  std::ifstream in(slurm_conf);
  std::string line;
  std::string socket;
  while (std::getline(in, line)) {
    const std::string text = trim(line.substr(0, line.find('#')));
    const auto eq = text.find('=');
    if (eq == std::string::npos) continue;
    std::string name = trim(text.substr(0, eq));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name != "authinfo") continue;  // Slurm's keys ignore case
    for (const std::string& option : split(trim(text.substr(eq + 1)), ',')) {
      if (option.starts_with("socket=")) socket = trim(option.substr(7));
    }
  }
  return socket;
}

}  // namespace ddprun::rdzv
