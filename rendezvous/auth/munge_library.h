// MungeLibrary: libmunge's functions, loaded at run time (dlopen) the first time MUNGE is used, so that
// ddprun starts on hosts without libmunge (every host that is not a Slurm node). Only munge.h is needed to
// build (libmunge-dev's header declares the types); the library is needed where MUNGE is used.
//
// The library's file: $DDPRUN_LIBMUNGE, else "libmunge.so.2" (libmunge's ABI since 0.5).
//
// Threads: munge_library() loads once and is thread-safe; the functions are libmunge's (thread-safe).
#pragma once

#include <munge.h>

#include <optional>
#include <string>

namespace ddprun::rdzv {

struct MungeLibrary {
  decltype(&munge_ctx_create) ctx_create = nullptr;
  decltype(&munge_ctx_destroy) ctx_destroy = nullptr;
  decltype(&munge_ctx_set) ctx_set = nullptr;
  decltype(&munge_ctx_strerror) ctx_strerror = nullptr;
  decltype(&munge_encode) encode = nullptr;
  decltype(&munge_decode) decode = nullptr;
};

// Loads `file` (a name the dynamic linker searches for, or a path); nullopt and `why` (naming the file, the
// linker's reason and what to do) when it cannot be loaded or lacks one of the functions.
std::optional<MungeLibrary> load_munge_library(const std::string& file, std::string& why);
// The process's libmunge (see the top of this file), loaded on the first call; null and `why` when it
// cannot be.
const MungeLibrary* munge_library(std::string& why);

}  // namespace ddprun::rdzv
