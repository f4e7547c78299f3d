#include "launcher/hostlist.h"

#include "rendezvous/util/text_util.h"

namespace ddprun::launcher {
namespace {

constexpr size_t kMaxHosts = 1 << 20;  // refuse lists that would expand absurdly

// "01-04,07" -> {"01","02","03","04","07"}.
bool expand_ranges(std::string_view body, std::vector<std::string>& out, std::string& error) {
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    std::string_view item = body.substr(start, comma == std::string_view::npos ? body.npos : comma - start);
    size_t dash = item.find('-');
    std::string_view lo = item.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    const auto first = parse_uint(lo), last = parse_uint(hi);
    if (!first || !last) {
      error = "bad range '" + std::string(item) + "' in '[" + std::string(body) + "]' (expected N or N-M)";
      return false;
    }
    const uint64_t a = *first, b = *last;
    if (b < a) {
      error = "range '" + std::string(item) + "' goes backwards";
      return false;
    }
    if (b - a > kMaxHosts || out.size() + (b - a) > kMaxHosts) {
      error = "range '" + std::string(item) + "' is too large";
      return false;
    }
    for (uint64_t v = a; v <= b; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');
      out.push_back(std::move(num));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return true;
}

// One host expression without top-level commas: "rack[1-2]-n[01-02]" = literals around bracket groups.
// Order of the expansion, as Slurm's hostlist.c recurses (it peels the last group first, then expands the
// prefix from its rightmost group leftwards): with groups g0..gm-1, g(m-2) varies slowest, then g(m-3) ...
// g0, and g(m-1) fastest. For one or two groups that is plain left-to-right order; "r[1-2]n[1-2]s[1-2]" gives
// r1n1s1 r1n1s2 r2n1s1 r2n1s2 r1n2s1 ... (scontrol 22.05).
bool expand_one(std::string_view expr, std::vector<std::string>& out, std::string& error) {
  std::vector<std::string> literals;             // literals[i] precedes groups[i]; one more at the end
  std::vector<std::vector<std::string>> groups;  // each group's values
  size_t pos = 0;
  while (true) {
    size_t open = expr.find('[', pos);
    std::string_view literal = expr.substr(pos, open == std::string_view::npos ? expr.npos : open - pos);
    if (literal.find(']') != std::string_view::npos) {
      error = "unbalanced ']' in '" + std::string(expr) + "'";
      return false;
    }
    literals.emplace_back(literal);
    if (open == std::string_view::npos) break;
    size_t close = expr.find(']', open);
    if (close == std::string_view::npos) {
      error = "missing ']' in '" + std::string(expr) + "'";
      return false;
    }
    groups.emplace_back();
    if (!expand_ranges(expr.substr(open + 1, close - open - 1), groups.back(), error)) return false;
    pos = close + 1;
  }
  size_t total = 1;
  for (const auto& g : groups) {
    total *= g.size();
    if (total > kMaxHosts) {
      error = "'" + std::string(expr) + "' expands to too many hosts";
      return false;
    }
  }
  // order[0] is the slowest group, order.back() the fastest.
  const size_t m = groups.size();
  std::vector<size_t> order;
  for (size_t k = m >= 2 ? m - 1 : 0; k-- > 0;) order.push_back(k);
  if (m > 0) order.push_back(m - 1);
  std::vector<size_t> at(m, 0);  // current value index of each group
  for (size_t n = 0; n < total; ++n) {
    std::string host = literals[0];
    for (size_t g = 0; g < m; ++g) host += groups[g][at[g]] + literals[g + 1];
    if (host.empty()) {
      error = "empty host name in '" + std::string(expr) + "'";
      return false;
    }
    out.push_back(std::move(host));
    for (size_t k = order.size(); k-- > 0;) {  // odometer: the fastest group first
      size_t g = order[k];
      if (++at[g] < groups[g].size()) break;
      at[g] = 0;
    }
  }
  return true;
}

}  // namespace

std::optional<std::vector<std::string>> expand_hostlist(std::string_view list, std::string& error) {
  std::vector<std::string> hosts;
  if (list.empty()) {
    error = "empty hostlist";
    return std::nullopt;
  }
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == ' ' || c == '\t' || c == '\n')
      c = ',';  // Slurm separates hosts by blanks too (outside brackets)
    if (c == '[') {
      if (++depth > 1) {
        error = "nested '[' in hostlist '" + std::string(list) + "'";
        return std::nullopt;
      }
    } else if (c == ']') {
      if (--depth < 0) {
        error = "hostlist '" + std::string(list) + "': unbalanced ']'";
        return std::nullopt;
      }
    } else if (c == ',' && depth == 0) {
      if (i == start) {  // empty item: "a,,b", a leading or trailing comma (Slurm skips them)
        start = i + 1;
        continue;
      }
      if (!expand_one(list.substr(start, i - start), hosts, error)) {
        error = "hostlist '" + std::string(list) + "': " + error;
        return std::nullopt;
      }
      start = i + 1;
    }
  }
  if (depth != 0) {
    error = "hostlist '" + std::string(list) + "': missing ']'";
    return std::nullopt;
  }
  if (hosts.empty()) {
    error = "hostlist '" + std::string(list) + "' names no host";
    return std::nullopt;
  }
  return hosts;
}

std::optional<std::vector<int>> expand_tasks_per_node(std::string_view spec, std::string& error) {
  std::vector<int> out;
  size_t start = 0;
  auto fail = [&](std::string_view item) -> std::optional<std::vector<int>> {
    error = "bad SLURM_TASKS_PER_NODE item '" + std::string(item) + "' in '" + std::string(spec) +
            "' (expected N or N(xM))";
    return std::nullopt;
  };
  if (spec.empty()) return fail(spec);
  while (true) {
    size_t comma = spec.find(',', start);
    std::string_view item = spec.substr(start, comma == std::string_view::npos ? spec.npos : comma - start);
    std::optional<uint64_t> count, times = 1;
    size_t paren = item.find('(');
    if (paren == std::string_view::npos) {
      count = parse_uint(item);
    } else {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')') return fail(item);
      count = parse_uint(item.substr(0, paren));
      times = parse_uint(item.substr(paren + 2, item.size() - paren - 3));
    }
    if (!count || *count > INT32_MAX || !times || *times == 0 || *times > kMaxHosts) return fail(item);
    if (out.size() + *times > kMaxHosts) return fail(item);
    out.insert(out.end(), *times, static_cast<int>(*count));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace ddprun::launcher
