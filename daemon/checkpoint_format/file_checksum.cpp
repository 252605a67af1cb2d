// Checkpoint file checksums in blocks, and the threads that compute them (file_checksum.hpp).
#include "daemon/checkpoint_format/file_checksum.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "comm/bucket_plan.hpp"
#include "common/thread_pool.hpp"

namespace thetad::daemon {

WordHash::WordHash() : h_(comm::fnv1a64("", 0)) {}

void WordHash::add(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0 && have_ > 0) {  // complete a word begun by the last piece
    carry_[have_++] = *p++;
    --n;
    if (have_ == 8) {
      h_ = comm::fnv1a64_words(carry_, 8, h_);
      have_ = 0;
    }
  }
  if (have_ > 0) return;  // the piece ended inside the word
  const size_t whole = n / 8 * 8;
  h_ = comm::fnv1a64_words(p, whole, h_);
  std::memcpy(carry_, p + whole, n - whole);
  have_ = n - whole;
}

uint64_t WordHash::value() const { return comm::fnv1a64(carry_, have_, h_); }

uint64_t combine_block_hashes(const std::vector<uint64_t>& blocks) {
  // Bytes in little-endian order whatever the host's, so that the checksum is the file's alone.
  std::vector<unsigned char> bytes(blocks.size() * 8);
  for (size_t i = 0; i < blocks.size(); ++i)
    for (int b = 0; b < 8; ++b) bytes[i * 8 + static_cast<size_t>(b)] = static_cast<unsigned char>(blocks[i] >> (8 * b));
  return comm::fnv1a64(bytes.data(), bytes.size());
}

uint64_t file_checksum(const void* data, size_t n, int threads) {
  const size_t blocks = static_cast<size_t>((n + kChecksumBlock - 1) / kChecksumBlock);
  std::vector<uint64_t> hashes(blocks);
  const auto* base = static_cast<const char*>(data);
  ThreadPool::files().parallel_for(blocks, [&](size_t i) {
    const size_t at = i * kChecksumBlock;
    hashes[i] = comm::fnv1a64_words(base + at, std::min<size_t>(kChecksumBlock, n - at));
  }, static_cast<size_t>(std::max(1, threads)));
  return combine_block_hashes(hashes);
}

bool file_checksum_of_fd(int fd, uint64_t size, int threads, uint64_t* sum) {
  const size_t blocks = static_cast<size_t>((size + kChecksumBlock - 1) / kChecksumBlock);
  std::vector<uint64_t> hashes(blocks);
  std::atomic<int> error{0};
  ThreadPool::files().parallel_for(blocks, [&](size_t i) {
    if (error.load()) return;
    thread_local std::vector<char> buf;
    const uint64_t at = i * kChecksumBlock, n = std::min<uint64_t>(kChecksumBlock, size - at);
    buf.resize(static_cast<size_t>(n));
    for (uint64_t got = 0; got < n;) {
      const ssize_t k = ::pread(fd, buf.data() + got, static_cast<size_t>(n - got), static_cast<off_t>(at + got));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        int none = 0;
        error.compare_exchange_strong(none, k < 0 ? errno : EIO);
        return;
      }
      got += static_cast<uint64_t>(k);
    }
    hashes[i] = comm::fnv1a64_words(buf.data(), static_cast<size_t>(n));
  }, static_cast<size_t>(std::max(1, threads)));
  if (error.load()) {
    errno = error.load();
    return false;
  }
  *sum = combine_block_hashes(hashes);
  return true;
}

int background_checkpoint_threads(int64_t bytes, double interval_s, double bytes_per_thread_s, int most) {
  most = std::max(1, most);
  if (interval_s <= 0 || bytes_per_thread_s <= 0) return most;
  const double needed = static_cast<double>(bytes) / (bytes_per_thread_s * interval_s / 2);
  return static_cast<int>(std::clamp(std::ceil(needed), 1.0, static_cast<double>(most)));
}

}  // namespace thetad::daemon
