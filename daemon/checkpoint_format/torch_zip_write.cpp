// write_torch_zip (torch_zip.hpp): the file cut into checksum blocks, each block's data pieces
// CRC'd, hashed and written by one thread while it is in that core's cache; the CRCs joined per
// record; then the headers (which hold the CRCs) written and the blocks holding them hashed.
#include <zlib.h>

#include <algorithm>
#include <atomic>

#include "comm/bucket_plan.hpp"
#include "common/thread_pool.hpp"
#include "daemon/checkpoint_format/file_checksum.hpp"
#include "daemon/checkpoint_format/torch_zip.hpp"

namespace thetad::daemon {
namespace {

// Within a block, bytes go in sub-pieces of this size: CRC, hash and write read them from cache.
constexpr uint64_t kSubPiece = uint64_t{1} << 20;

// A run of the file's bytes: a record's data or a header (meta: local header i, or the directory
// at index records.size()).
struct Segment {
  uint64_t at = 0, len = 0;
  bool data = false;
  size_t index = 0;  // the record (data) or the meta block
};

// A record's bytes within one block.
struct Piece {
  size_t record = 0;
  uint64_t from = 0, len = 0;  // within the record
  uint32_t crc = 0;
};

}  // namespace

TorchZipResult write_torch_zip(const std::vector<TorchZipRecord>& records, const TorchZipSink& sink) {
  std::vector<std::pair<std::string, uint64_t>> sizes;
  for (const TorchZipRecord& r : records) sizes.emplace_back(r.name, r.size);
  const TorchZipLayout layout(sizes);
  const auto& entries = layout.entries();
  const uint64_t size = layout.file_size();
  std::vector<Segment> segments;
  for (size_t i = 0; i < entries.size(); ++i) {
    segments.push_back({entries[i].header_at, entries[i].data_at - entries[i].header_at, false, i});
    if (entries[i].size > 0) segments.push_back({entries[i].data_at, entries[i].size, true, i});
  }
  segments.push_back({layout.directory_at(), size - layout.directory_at(), false, records.size()});

  // The data pieces in file order, each within one block; a block is pure when one piece fills it.
  const size_t blocks = static_cast<size_t>((size + kChecksumBlock - 1) / kChecksumBlock);
  std::vector<Piece> pieces;
  std::vector<size_t> first_piece(blocks + 1, 0);
  for (size_t k = 0, s = 0; k < blocks; ++k) {
    first_piece[k] = pieces.size();
    const uint64_t lo = k * kChecksumBlock, hi = std::min(size, lo + kChecksumBlock);
    while (s < segments.size() && segments[s].at + segments[s].len <= lo) ++s;
    for (size_t t = s; t < segments.size() && segments[t].at < hi; ++t) {
      const Segment& g = segments[t];
      if (!g.data) continue;
      const uint64_t a = std::max(lo, g.at), b = std::min(hi, g.at + g.len);
      pieces.push_back({g.index, a - g.at, b - a, 0});
    }
  }
  first_piece[blocks] = pieces.size();
  const auto block_len = [&](size_t k) { return std::min(kChecksumBlock, size - k * kChecksumBlock); };
  const auto pure = [&](size_t k) {
    return first_piece[k + 1] - first_piece[k] == 1 && pieces[first_piece[k]].len == block_len(k);
  };

  std::vector<uint64_t> hashes(blocks, 0);
  std::atomic<bool> stopped{false};
  const auto stop = [&] { return stopped.load(std::memory_order_relaxed) || (sink.cancel && sink.cancel->load()); };
  ThreadPool::files().parallel_for(blocks, [&](size_t k) {
    if (stop()) return;
    const bool whole = pure(k);
    uint64_t h = comm::fnv1a64("", 0);  // the FNV basis: a pure block's hash, chained over sub-pieces
    for (size_t j = first_piece[k]; j < first_piece[k + 1]; ++j) {
      Piece& pc = pieces[j];
      if (sink.prepare) sink.prepare(pc.record, pc.from, pc.len);
      const char* base = static_cast<const char*>(records[pc.record].data);
      const uint64_t at = entries[pc.record].data_at;
      uLong crc = crc32(0L, Z_NULL, 0);
      for (uint64_t off = pc.from; off < pc.from + pc.len; off += kSubPiece) {
        const uint64_t n = std::min(kSubPiece, pc.from + pc.len - off);
        crc = crc32(crc, reinterpret_cast<const Bytef*>(base + off), static_cast<uInt>(n));
        if (whole) h = comm::fnv1a64_words(base + off, n, h);
        if (!sink.write_at(base + off, n, at + off)) {
          stopped = true;
          return;
        }
        if (stop()) return;
      }
      pc.crc = static_cast<uint32_t>(crc);
      if (sink.written) sink.written(at + pc.from, pc.len);
    }
    if (whole) hashes[k] = h;
  }, static_cast<size_t>(std::max(1, sink.threads)));
  TorchZipResult result;
  if (stop()) return result;

  std::vector<uint32_t> crcs(records.size(), 0);
  for (const Piece& pc : pieces)
    crcs[pc.record] = static_cast<uint32_t>(crc32_combine(crcs[pc.record], pc.crc, static_cast<z_off_t>(pc.len)));
  std::vector<std::string> metas;
  for (size_t i = 0; i < entries.size(); ++i) metas.push_back(layout.local_header(i, crcs[i]));
  metas.push_back(layout.directory(crcs));
  for (const Segment& g : segments)
    if (!g.data && !sink.write_at(metas[g.index].data(), g.len, g.at)) return result;

  // The blocks with headers in them, hashed from the same bytes as were written.
  std::vector<size_t> mixed;
  for (size_t k = 0; k < blocks; ++k)
    if (!pure(k)) mixed.push_back(k);
  ThreadPool::files().parallel_for(mixed.size(), [&](size_t m) {
    const size_t k = mixed[m];
    const uint64_t lo = k * kChecksumBlock, hi = lo + block_len(k);
    WordHash h;
    for (const Segment& g : segments) {
      const uint64_t a = std::max(lo, g.at), b = std::min(hi, g.at + g.len);
      if (a >= b) continue;
      const char* base = g.data ? static_cast<const char*>(records[g.index].data) : metas[g.index].data();
      h.add(base + (a - g.at), b - a);
    }
    hashes[k] = h.value();
  }, static_cast<size_t>(std::max(1, sink.threads)));
  result.ok = true;
  result.size = size;
  result.checksum = combine_block_hashes(hashes);
  return result;
}

}  // namespace thetad::daemon
