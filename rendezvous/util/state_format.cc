#include "rendezvous/util/state_format.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "rendezvous/util/text_util.h"

namespace ddprun {

namespace {

constexpr std::string_view kFirstLine = "ddprun-state 1";
constexpr std::string_view kSuffix = ".ddps";

// "<digits>" as a non-negative integer of at most `max`.
std::optional<uint64_t> number(std::string_view text, uint64_t max) {
  const auto v = parse_uint(text);
  if (!v || *v > max) return std::nullopt;
  return v;
}

// Splits "a b c" at single spaces into at most `n` parts, the last one keeping the rest of the line.
std::vector<std::string_view> fields(std::string_view line, size_t n) {
  std::vector<std::string_view> out;
  while (out.size() + 1 < n) {
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) break;
    out.push_back(line.substr(0, sp));
    line.remove_prefix(sp + 1);
  }
  out.push_back(line);
  return out;
}

bool pread_all(int fd, char* out, uint64_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

}  // namespace

std::string version_file_name(const VersionName& v) {
  return "rank" + std::to_string(v.rank) + ".step" + std::to_string(v.step) + std::string(kSuffix);
}

std::optional<VersionName> parse_version_file_name(std::string_view name) {
  if (!name.starts_with("rank") || !name.ends_with(kSuffix)) return std::nullopt;
  name.remove_prefix(4);
  name.remove_suffix(kSuffix.size());
  const size_t dot = name.find(".step");
  if (dot == std::string_view::npos) return std::nullopt;
  const auto rank = number(name.substr(0, dot), std::numeric_limits<int>::max());
  const auto step = number(name.substr(dot + 5), std::numeric_limits<int64_t>::max());
  if (!rank || !step) return std::nullopt;
  // Plain decimals only: "rank01" is not rank 1's (its name would differ from version_file_name's).
  VersionName v{static_cast<int>(*rank), static_cast<int64_t>(*step)};
  if (version_file_name(v) != std::string("rank") + std::string(name) + std::string(kSuffix))
    return std::nullopt;
  return v;
}

bool is_temporary_state_file(std::string_view name) {
  return name.size() > 5 && name.starts_with('.') && name.ends_with(".tmp");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "-";
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "x" : "") + std::to_string(shape[i]);
  return out;
}

std::optional<std::vector<int64_t>> parse_shape(std::string_view text) {
  std::vector<int64_t> shape;
  if (text == "-") return shape;
  for (const std::string& part : split(text, 'x')) {
    const auto d = number(part, std::numeric_limits<int64_t>::max());
    if (!d) return std::nullopt;
    shape.push_back(static_cast<int64_t>(*d));
  }
  return shape;
}

std::optional<uint64_t> dtype_bytes(std::string_view dtype) {
  static const std::pair<std::string_view, uint64_t> kSizes[] = {
      {"float64", 8},       {"float32", 4},     {"float16", 2},         {"bfloat16", 2},
      {"int64", 8},         {"int32", 4},       {"int16", 2},           {"int8", 1},
      {"uint8", 1},         {"bool", 1},        {"complex128", 16},     {"complex64", 8},
      {"complex32", 4},     {"uint16", 2},      {"uint32", 4},          {"uint64", 8},
      {"float8_e4m3fn", 1}, {"float8_e5m2", 1}, {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1}};
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return std::nullopt;
}

std::string manifest_text(const Manifest& m) {
  std::string out(kFirstLine);
  out += "\nstep " + std::to_string(m.step) + "\nattempt " + std::to_string(m.attempt) + "\nrank " +
         std::to_string(m.rank) + "\nworld_size " + std::to_string(m.world_size) + "\npayload " +
         std::to_string(m.payload) + "\nwriter " + m.writer + "\n";
  for (const TensorEntry& t : m.tensors) {
    out += "tensor " + std::to_string(t.offset) + " " + std::to_string(t.nbytes) + " " + t.dtype + " " +
           shape_text(t.shape) + " " + t.device + (t.name.empty() ? "" : " " + t.name) + "\n";
  }
  if (m.pickle) {
    out += "pickle " + std::to_string(m.pickle->first) + " " + std::to_string(m.pickle->second) + "\n";
  }
  return out;
}

std::optional<Manifest> parse_manifest(std::string_view text, std::string& why) {
  Manifest m;
  bool have_step = false, have_rank = false, have_world = false, have_payload = false;
  const std::vector<std::string> lines = split(text, '\n');
  if (lines.empty() || lines[0] != kFirstLine) {
    why = "the manifest does not start with '" + std::string(kFirstLine) + "'";
    return std::nullopt;
  }
  auto bad = [&](const std::string& line) {
    why = "unreadable manifest line '" + printable(line) + "'";
    return std::nullopt;
  };
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.empty()) continue;
    const auto f = fields(line, 2);
    const std::string_view key = f[0], value = f.size() > 1 ? f[1] : "";
    if (key == "step" || key == "payload") {
      const auto v = number(value, std::numeric_limits<int64_t>::max());
      if (!v) return bad(line);
      if (key == "step") {
        m.step = static_cast<int64_t>(*v);
        have_step = true;
      } else {
        m.payload = *v;
        have_payload = true;
      }
    } else if (key == "attempt" || key == "rank" || key == "world_size") {
      const auto v = number(value, std::numeric_limits<int>::max());
      if (!v) return bad(line);
      (key == "attempt" ? m.attempt : key == "rank" ? m.rank : m.world_size) = static_cast<int>(*v);
      have_rank = have_rank || key == "rank";
      have_world = have_world || key == "world_size";
    } else if (key == "writer") {
      m.writer = std::string(value);
    } else if (key == "tensor") {
      const auto t = fields(line, 7);
      if (t.size() < 6) return bad(line);
      TensorEntry e;
      const auto offset = number(t[1], std::numeric_limits<int64_t>::max());
      const auto nbytes = number(t[2], std::numeric_limits<int64_t>::max());
      const auto shape = parse_shape(t[4]);
      if (!offset || !nbytes || !shape || !dtype_bytes(t[3])) return bad(line);
      e.offset = *offset;
      e.nbytes = *nbytes;
      e.dtype = std::string(t[3]);
      e.shape = *shape;
      e.device = std::string(t[5]);
      if (t.size() > 6) e.name = std::string(t[6]);
      m.tensors.push_back(std::move(e));
    } else if (key == "pickle") {
      const auto p = fields(line, 3);
      if (p.size() != 3) return bad(line);
      const auto offset = number(p[1], std::numeric_limits<int64_t>::max());
      const auto nbytes = number(p[2], std::numeric_limits<int64_t>::max());
      if (!offset || !nbytes) return bad(line);
      m.pickle = std::pair{*offset, *nbytes};
    }
  }
  if (!have_step || !have_rank || !have_world || !have_payload) {
    why = "the manifest lacks step, rank, world_size or payload";
    return std::nullopt;
  }
  auto inside = [&](uint64_t offset, uint64_t n) { return offset <= m.payload && n <= m.payload - offset; };
  for (const TensorEntry& t : m.tensors) {
    if (!inside(t.offset, t.nbytes)) {
      why = "a tensor lies outside the payload";
      return std::nullopt;
    }
  }
  if (m.pickle && !inside(m.pickle->first, m.pickle->second)) {
    why = "the pickle lies outside the payload";
    return std::nullopt;
  }
  return m;
}

std::string manifest_trailer(const Manifest& m) {
  std::string out = manifest_text(m);
  uint64_t n = out.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.append(len, 8);
  out.append(kStateMagic);
  return out;
}

std::optional<Manifest> read_manifest(int fd, uint64_t size, std::string& why) {
  char tail[16];
  if (size < sizeof tail || !pread_all(fd, tail, sizeof tail, size - sizeof tail)) {
    why = "too short for a version file (" + std::to_string(size) + " bytes)";
    return std::nullopt;
  }
  if (std::string_view(tail + 8, 8) != kStateMagic) {
    why = "no version file (its last 8 bytes are not the magic)";
    return std::nullopt;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(tail[i]);
  if (n > kMaxManifestBytes || n > size - sizeof tail) {
    why = "a manifest length of " + std::to_string(n) + " bytes in a file of " + std::to_string(size);
    return std::nullopt;
  }
  std::string text(n, '\0');
  if (!pread_all(fd, text.data(), n, size - sizeof tail - n)) {
    why = std::string("cannot read the manifest: ") + std::strerror(errno);
    return std::nullopt;
  }
  auto m = parse_manifest(text, why);
  if (m && m->payload != size - sizeof tail - n) {
    why = "the manifest's payload of " + std::to_string(m->payload) + " bytes does not fit the file's " +
          std::to_string(size);
    return std::nullopt;
  }
  return m;
}

std::vector<StoredVersion> list_versions(const std::filesystem::path& dir, int rank) {
  std::vector<StoredVersion> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = parse_version_file_name(it->path().filename().string());
    if (!name || (rank >= 0 && name->rank != rank)) continue;
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

void prune_versions(const std::filesystem::path& dir, int rank, size_t keep) {
  const auto of_rank = list_versions(dir, rank);
  for (size_t i = 0; i + keep < of_rank.size(); ++i) {
    std::error_code ignored;
    std::filesystem::remove(of_rank[i].file, ignored);
  }
}

}  // namespace ddprun
