#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace ddprun::sdk {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& name) {
  throw std::system_error(errno, std::generic_category(), what + " of shared memory segment " + name);
}


std::byte* map(int fd, size_t bytes, const std::string& name) {
  // MAP_POPULATE: fault the pages in now, not in the first collective.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    errno = e;
    fail("mmap", name);
  }
  ::close(fd);
  return static_cast<std::byte*>(p);
}

}  // namespace

std::string shm_full_message(const std::string& name, size_t bytes) {
  std::string text = "/dev/shm has no room for the shared memory segment " + name + " (" +
                     std::to_string(bytes) + " bytes needed";
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) == 0) {
    text += ", " + std::to_string(static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize) + " of " +
            std::to_string(static_cast<unsigned long long>(fs.f_blocks) * fs.f_frsize) + " bytes free";
  }
  return text +
         "). Give the workers a larger /dev/shm (docker run --shm-size, a memory-backed emptyDir on /dev/shm "
         "in Kubernetes), or use the TCP path with DDPRUN_CPU_TRANSPORT=tcp";
}


std::unique_ptr<ShmSegment> ShmSegment::create(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fail("shm_open(O_CREAT|O_EXCL)", name);
  // ftruncate alone reserves nothing on tmpfs: a full /dev/shm would surface as SIGBUS at the first write
  // into the mapping. posix_fallocate takes the pages now, or says ENOSPC while a clear error can still be
  // given.
  const int e = ::ftruncate(fd, static_cast<off_t>(bytes)) != 0
                    ? errno
                    : ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (e != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    if (e == ENOSPC) throw std::system_error(e, std::generic_category(), shm_full_message(name, bytes));
    errno = e;
    fail("reserving " + std::to_string(bytes) + " bytes", name);
  }
  std::byte* base;
  try {
    base = map(fd, bytes, name);
  } catch (...) {
    ::shm_unlink(name.c_str());
    throw;
  }
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, base, bytes, true));
}

std::unique_ptr<ShmSegment> ShmSegment::attach(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) fail("shm_open", name);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    fail("fstat", name);
  }
  size_t bytes = static_cast<size_t>(st.st_size);
  return std::unique_ptr<ShmSegment>(new ShmSegment(name, map(fd, bytes, name), bytes, false));
}

void ShmSegment::unlink() {
  if (!owner_ || unlinked_) return;
  unlinked_ = true;
  ::shm_unlink(name_.c_str());
}

ShmSegment::~ShmSegment() {
  unlink();
  ::munmap(base_, size_);
}

}  // namespace ddprun::sdk
