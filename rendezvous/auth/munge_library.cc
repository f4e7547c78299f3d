#include "rendezvous/auth/munge_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace ddprun::rdzv {

namespace {

constexpr const char* kDefaultFile = "libmunge.so.2";

template <class Fn>
bool resolve(void* handle, const char* name, Fn& out, std::string& missing) {
  out = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (!out) missing += (missing.empty() ? "" : ", ") + std::string(name);
  return out != nullptr;
}

}  // namespace

std::optional<MungeLibrary> load_munge_library(const std::string& file, std::string& why) {
  void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* error = ::dlerror();
    why = "libmunge cannot be loaded (" + std::string(error ? error : file) +
          "): install it (Debian, Ubuntu: apt-get install libmunge2; RHEL: dnf install munge-libs), name "
          "its file with DDPRUN_LIBMUNGE, or authenticate with --rdzv_secret_file";
    return std::nullopt;
  }
  MungeLibrary lib;
  std::string missing;
  resolve(handle, "munge_ctx_create", lib.ctx_create, missing);
  resolve(handle, "munge_ctx_destroy", lib.ctx_destroy, missing);
  resolve(handle, "munge_ctx_set", lib.ctx_set, missing);
  resolve(handle, "munge_ctx_strerror", lib.ctx_strerror, missing);
  resolve(handle, "munge_encode", lib.encode, missing);
  resolve(handle, "munge_decode", lib.decode, missing);
  if (!missing.empty()) {
    ::dlclose(handle);
    why = file + " is not libmunge: it lacks " + missing;
    return std::nullopt;
  }
  return lib;  // the handle stays open for the process's life
}

const MungeLibrary* munge_library(std::string& why) {
  static std::once_flag once;
  static std::optional<MungeLibrary> lib;
  static std::string error;
  std::call_once(once, [] {
    const char* file = std::getenv("DDPRUN_LIBMUNGE");
    lib = load_munge_library(file && *file ? file : kDefaultFile, error);
  });
  if (!lib) why = error;
  return lib ? &*lib : nullptr;
}

}  // namespace ddprun::rdzv
