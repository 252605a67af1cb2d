// The checksum of a checkpoint file (format 5, manifest.hpp): FNV-1a 64 over 64-bit words
// (comm::fnv1a64_words) of each kChecksumBlock bytes of the file, then FNV-1a 64 over those block
// hashes, so that the threads writing a file's blocks also hash them (torch_zip.hpp). Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace thetad::daemon {

// 4 MiB: a 256 MiB file is 64 blocks for the writer threads; small enough that the few blocks
// holding zip headers, hashed once the CRCs are known, cost little.
constexpr uint64_t kChecksumBlock = uint64_t{4} << 20;

// FNV-1a 64 over 64-bit words of bytes that come in pieces of any length: equal to
// comm::fnv1a64_words over the pieces joined.
class WordHash {
 public:
  WordHash();
  void add(const void* p, size_t n);
  uint64_t value() const;

 private:
  uint64_t h_;
  unsigned char carry_[8] = {};
  size_t have_ = 0;
};

// The file checksum from its blocks' hashes (block i: bytes [i, i + 1) * kChecksumBlock), as
// little-endian 64-bit values hashed with comm::fnv1a64.
uint64_t combine_block_hashes(const std::vector<uint64_t>& blocks);
// The checksum of `n` bytes held in memory, its blocks hashed on up to `threads` threads of the
// file pool (ThreadPool::files, common/thread_pool.hpp; a rank's file work: cpu_share).
uint64_t file_checksum(const void* data, size_t n, int threads = 1);
// The checksum of the file open as `fd`, its first `size` bytes read block by block (pread, one
// block's buffer per thread) on up to `threads` threads of the file pool, into *sum. False, errno
// kept, where a block cannot be read whole (a read error, or the file shorter than `size`).
bool file_checksum_of_fd(int fd, uint64_t size, int threads, uint64_t* sum);
// The threads of a checkpoint written in the background: the fewest (1..`most`) that write
// `bytes` within half of `interval_s` (the time until the next checkpoint) at `bytes_per_thread_s`
// each. Every writer thread slows a trainer that feeds its GPU from the host, even at a lower
// priority (the LoRA job in bf16, one H100: +46 ms over the 5 steps after a checkpoint with 8
// threads, +13 ms with 1, which is the snapshot alone); a write that finishes well before the
// next checkpoint needs no more. `most` where the interval is unknown (<= 0).
int background_checkpoint_threads(int64_t bytes, double interval_s, double bytes_per_thread_s, int most);

}  // namespace thetad::daemon
