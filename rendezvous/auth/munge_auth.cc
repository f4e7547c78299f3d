#include "rendezvous/auth/munge_auth.h"

#include <munge.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "rendezvous/util/text_util.h"

namespace ddprun::rdzv {

namespace {

struct ContextDeleter {
  void operator()(munge_ctx_t ctx) const { munge_ctx_destroy(ctx); }
};
using Context = std::unique_ptr<std::remove_pointer_t<munge_ctx_t>, ContextDeleter>;

Context context(const std::string& socket) {
  Context ctx(munge_ctx_create());
  if (!ctx) throw std::runtime_error("libmunge: no memory for a context");
  if (!socket.empty() && munge_ctx_set(ctx.get(), MUNGE_OPT_SOCKET, socket.c_str()) != EMUNGE_SUCCESS) {
    throw std::runtime_error("libmunge refuses the socket " + socket + ": " + munge_ctx_strerror(ctx.get()));
  }
  return ctx;
}

std::string socket_name(const std::string& socket) {
  return socket.empty() ? std::string("munged's default socket (/run/munge/munge.socket.2)") : socket;
}

}  // namespace

MungeAuth::MungeAuth(std::string socket, std::string job)
    : socket_(std::move(socket)), job_(std::move(job)), uid_(getuid()) {}

std::string MungeAuth::what() const {
  return "a MUNGE credential of " + job_ + " (uid " + std::to_string(uid_) + ")";
}

std::string MungeAuth::proof(std::string_view role, std::string_view client_nonce,
                             std::string_view store_nonce) const {
  const std::string payload = auth_message({role, job_, client_nonce, store_nonce});
  Context ctx = context(socket_);
  char* cred = nullptr;
  if (munge_encode(&cred, ctx.get(), payload.data(), static_cast<int>(payload.size())) != EMUNGE_SUCCESS) {
    std::free(cred);
    throw std::runtime_error("munged at " + socket_name(socket_) +
                             " made no credential: " + munge_ctx_strerror(ctx.get()));
  }
  std::string out(cred);
  std::free(cred);
  return out;
}

bool MungeAuth::verify(std::string_view role, std::string_view client_nonce, std::string_view store_nonce,
                       std::string_view given, std::string& why) const {
  Context ctx;
  try {
    ctx = context(socket_);
  } catch (const std::runtime_error& e) {  // never throws on the store's thread
    why = e.what();
    return false;
  }
  void* data = nullptr;
  int length = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  const std::string cred(given);
  const munge_err_t err = munge_decode(cred.c_str(), ctx.get(), &data, &length, &uid, &gid);
  const std::string payload =
      data ? std::string(static_cast<const char*>(data), static_cast<size_t>(length)) : "";
  std::free(data);
  if (err != EMUNGE_SUCCESS) {
    why = "a MUNGE credential that munged at " + socket_name(socket_) +
          " refuses: " + munge_ctx_strerror(ctx.get()) +
          (err == EMUNGE_CRED_INVALID ? " (made with another MUNGE key: a node of another cluster?)" : "");
    return false;
  }
  if (uid != uid_) {
    why = "a MUNGE credential of uid " + std::to_string(uid) + ", not of the job's user (uid " +
          std::to_string(uid_) + "): every agent of a job runs as the same user";
    return false;
  }
  if (payload != auth_message({role, job_, client_nonce, store_nonce})) {
    why = "a MUNGE credential made for another job or another connection (this side is " + job_ + ")";
    return false;
  }
  return true;
}

std::string MungeAuth::check() const {
  try {
    const std::string n = nonce();
    std::string why;
    return verify("check", n, n, proof("check", n, n), why) ? "" : why;
  } catch (const std::runtime_error& e) {
    return e.what();
  }
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
