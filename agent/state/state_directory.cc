#include "agent/state/state_directory.h"

#include <algorithm>
#include <system_error>

namespace ddprun::agent {

namespace fs = std::filesystem;

StateDirectory::StateDirectory(fs::path dir) : dir_(std::move(dir)) {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
  fs::create_directories(dir_.parent_path());
  fs::create_directory(dir_);
  fs::permissions(dir_, fs::perms::owner_all);
  fs::create_directory(own());
  fs::create_directory(replica());
}

std::optional<StoredVersion> StateDirectory::newest(const fs::path& sub, int rank) {
  auto of_rank = list_versions(sub, rank);
  if (of_rank.empty()) return std::nullopt;
  return std::move(of_rank.back());
}

std::vector<std::string> StateDirectory::remove_temporaries(const fs::path& sub) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(sub, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code rm_ec;
    if (is_temporary_state_file(name) && fs::remove(it->path(), rm_ec)) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

uint64_t StateDirectory::bytes_held() const {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const uint64_t n = it->file_size(size_ec);
      if (!size_ec) total += n;
    }
  }
  return total;
}

void StateDirectory::remove() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

}  // namespace ddprun::agent
