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

std::vector<StoredVersion> StateDirectory::versions(const fs::path& sub) {
  std::vector<StoredVersion> out;
  std::error_code ec;
  for (fs::directory_iterator it(sub, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = parse_version_file_name(it->path().filename().string());
    if (!name) continue;
    std::error_code size_ec;
    const uint64_t bytes = it->file_size(size_ec);
    if (size_ec) continue;  // removed meanwhile
    out.push_back({*name, it->path(), bytes});
  }
  std::sort(out.begin(), out.end(), [](const StoredVersion& a, const StoredVersion& b) {
    return a.name.rank != b.name.rank ? a.name.rank < b.name.rank : a.name.step < b.name.step;
  });
  return out;
}

std::optional<StoredVersion> StateDirectory::newest(const fs::path& sub, int rank) {
  std::optional<StoredVersion> found;
  for (auto& v : versions(sub)) {
    if (v.name.rank == rank) found = std::move(v);
  }
  return found;
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

void StateDirectory::prune(const fs::path& sub, int rank, size_t keep) {
  std::vector<StoredVersion> of_rank;
  for (auto& v : versions(sub)) {
    if (v.name.rank == rank) of_rank.push_back(std::move(v));
  }
  for (size_t i = 0; i + keep < of_rank.size(); ++i) {
    std::error_code ignored;
    fs::remove(of_rank[i].file, ignored);
  }
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
