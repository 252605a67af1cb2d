// Collects job errors with their origin and formats them as `FILE:LINE:COL: KEY.PATH: what`
// (or `--set KEY.PATH: what`); also the "did you mean" machinery (edit distance).
#include "config/diagnostics.hpp"

#include <algorithm>
#include <numeric>

#include "common/text.hpp"
#include "config/limits.hpp"

namespace thetad::config::detail {

std::string parent_path(const std::string& path) {
  if (path.empty()) return "";
  if (path.back() == ']') {
    const auto open = path.rfind('[');
    return open == std::string::npos ? "" : path.substr(0, open);
  }
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

void Diagnostics::forget_under(const std::string& path) {
  for (auto it = origins_.begin(); it != origins_.end();) {
    const std::string& p = it->first;
    const bool child = p.size() > path.size() && p.compare(0, path.size(), path) == 0 &&
                       (p[path.size()] == '.' || p[path.size()] == '[');
    it = (p == path || child) ? origins_.erase(it) : std::next(it);
  }
  for (auto it = bad_.begin(); it != bad_.end();) {
    const std::string& p = *it;
    const bool child = p.size() > path.size() && p.compare(0, path.size(), path) == 0 &&
                       (p[path.size()] == '.' || p[path.size()] == '[');
    it = (p == path || child) ? bad_.erase(it) : std::next(it);
  }
}

Origin Diagnostics::where(const std::string& path) const {
  for (std::string p = path;; p = parent_path(p)) {
    const auto it = origins_.find(p);
    if (it != origins_.end()) return it->second;
    if (p.empty()) return Origin{1, 1, false};
  }
}

bool Diagnostics::bad(const std::string& path) const {
  for (std::string p = path; !p.empty(); p = parent_path(p))
    if (bad_.count(p)) return true;
  return false;
}

std::string Diagnostics::format(Origin where, const std::string& path, const std::string& what) const {
  if (where.from_override) return printable("--set " + path + ": " + what);
  if (!where.known()) where = Origin{1, 1, false};
  // A binary job file's bytes are never echoed raw.
  return printable(source_ + ":" + std::to_string(where.line) + ":" + std::to_string(where.col) + ": " +
                   (path.empty() ? "" : path + ": ") + what);
}

void Diagnostics::error_at(Origin where, const std::string& path, const std::string& what) {
  if (entries_.size() >= kMaxJobErrors) {
    ++unshown_;
    return;
  }
  if (!where.from_override && !where.known()) where = Origin{1, 1, false};
  entries_.push_back({where, format(where, path, what)});
}

void Diagnostics::warning(const std::string& path, const std::string& what) {
  warnings_.push_back(format(where(path), path, what));
}

void Diagnostics::error(const std::string& path, const std::string& what,
                        const std::string& anchor) {
  const bool use_anchor = !given(path) && !anchor.empty() && given(anchor);
  error_at(where(use_anchor ? anchor : path), path, what);
}

std::vector<std::string> Diagnostics::messages() const {
  std::vector<size_t> order(entries_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Origin& x = entries_[a].where;
    const Origin& y = entries_[b].where;
    if (x.from_override != y.from_override) return !x.from_override;
    if (x.line != y.line) return x.line < y.line;
    return x.col < y.col;
  });
  std::vector<std::string> out;
  out.reserve(order.size());
  for (size_t i : order) out.push_back(entries_[i].text);
  if (unshown_ > 0)
    out.push_back(printable(source_ + ": " + std::to_string(unshown_) + " more errors not shown (the first " +
                            std::to_string(entries_.size()) + " found are above)"));
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  // Short words tolerate one typo, longer ones up to three: beyond that a guess misleads.
  const size_t limit = word.size() <= 3 ? 1 : word.size() <= 6 ? 2 : 3;
  std::string best;
  size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

}  // namespace thetad::config::detail
