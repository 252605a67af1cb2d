// offload::FrozenLayers as real MPI processes of one node, on the host device: a frozen model's
// layers brought into slots walking forward and back, copied from the node's host copy
// (LayerSource::host) or gathered from the node's ranks' shards (LayerSource::node_shards), and
// every slot holds the layer's bytes. The sharded walk runs with the host copy overwritten after
// the fill, so that a gather that read it instead of the shards would fail; the layers' sizes are
// not multiples of the ranks, and one is smaller than a shard's chunk (some ranks hold none of it).
// With a GPU (skipped without), the same gather on CudaDevice: the node's ranks' shards mapped
// through CUDA IPC (ranks that share one GPU map it as is), each slot copied back and checked.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <vector>

#include "comm/node_memory.hpp"
#include "offload/device.hpp"
#include "offload/frozen_layers.hpp"

namespace off = thetad::offload;

namespace {

// Part k of layer l: bytes of odd sizes, the last layer smaller than 256 x ranks.
std::vector<std::vector<size_t>> layer_parts() {
  return {{1000, 37, 4099}, {5, 777}, {8192, 1}, {3000, 3000, 3001}, {100}};
}

char byte_of(int layer, int part, size_t i) { return static_cast<char>((layer * 131 + part * 17 + i * 7) % 251); }

// Walks forward then back `passes` times, each acquire's slot checked part by part (on a GPU,
// copied back to `device`'s host first, after the copies that brought it in).
void walk_and_check(off::FrozenLayers& base, int passes, off::Device* device = nullptr) {
  const auto parts = layer_parts();
  std::vector<char> host(16384);
  for (int p = 0; p < passes; ++p)
    for (int direction : {1, -1})
      for (int k = 0; k < base.layers(); ++k) {
        const int l = direction > 0 ? k : base.layers() - 1 - k;
        const char* slot = base.acquire(l, direction);
        if (device) {
          const size_t bytes = base.part_offset(l, static_cast<int>(parts[static_cast<size_t>(l)].size()) - 1) +
                               parts[static_cast<size_t>(l)].back();
          device->host_wait(device->d2h(host.data(), slot, bytes, device->record_compute()));
          slot = host.data();
        }
        for (size_t part = 0; part < parts[static_cast<size_t>(l)].size(); ++part) {
          const char* got = slot + base.part_offset(l, static_cast<int>(part));
          size_t bad = 0;
          for (size_t i = 0; i < parts[static_cast<size_t>(l)][part]; ++i)
            bad += got[i] != byte_of(l, static_cast<int>(part), i);
          EXPECT_EQ(bad, 0u) << "layer " << l << " part " << part << " pass " << p << " direction " << direction;
        }
        base.release(l);
      }
}

void fill_pattern(off::FrozenLayers& base) {
  const auto parts = layer_parts();
  base.fill([&](int layer, int part, char* dst) {
    for (size_t i = 0; i < parts[static_cast<size_t>(layer)][static_cast<size_t>(part)]; ++i)
      dst[i] = byte_of(layer, part, i);
  });
}

}  // namespace

TEST(FrozenLayersMpi, StreamedLayersAreTheHostCopy) {
  off::HostDevice device;
  off::FrozenLayers base(thetad::comm::make_node_memory(), layer_parts(), device, 1, 0);
  fill_pattern(base);
  walk_and_check(base, 2);
  // 5 layers through 3 slots: the first walk copies all 5; each of the 3 turns finds the 3 layers
  // nearest it still there and copies the other 2.
  EXPECT_EQ(base.stats().copies, 5u + 3u * 2u);
  EXPECT_EQ(base.stats().misses, 1u);  // the first layer of the first pass
}

TEST(FrozenLayersMpi, ShardedLayersAreGatheredFromTheShards) {
  off::HostDevice device;
  off::FrozenLayers base(thetad::comm::make_node_memory(), layer_parts(), device, 2, 0,
                         off::LayerSource::node_shards);
  fill_pattern(base);
  ASSERT_TRUE(base.sharded());
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's shard written from the host copy (fill) before it is spoiled
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    for (int l = 0; l < base.layers(); ++l)
      for (size_t k = 0; k < layer_parts()[static_cast<size_t>(l)].size(); ++k)
        std::memset(const_cast<char*>(base.host_part(l, static_cast<int>(k))), 0x5a, layer_parts()[static_cast<size_t>(l)][k]);
  MPI_Barrier(MPI_COMM_WORLD);
  walk_and_check(base, 2);
  EXPECT_EQ(base.stats().misses, 1u);
}

TEST(FrozenLayersMpi, ShardBytesSplitEveryLayer) {
  int ranks = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const auto parts = layer_parts();
  // Each layer's chunk is its bytes over the ranks rounded up to 256: at least 1/ranks of the
  // base, at most 256 bytes a layer more.
  const size_t whole = off::FrozenLayers::shard_bytes(parts, 1);
  const size_t each = off::FrozenLayers::shard_bytes(parts, ranks);
  EXPECT_GE(each * static_cast<size_t>(ranks), whole);
  EXPECT_LE(each, whole / static_cast<size_t>(ranks) + 256 * parts.size());
}

TEST(FrozenLayersMpi, ShardedLayersAreGatheredOnTheGpu) {
  if (!off::cuda_available()) GTEST_SKIP() << "no GPU";
  auto device = off::make_cuda_device(0, nullptr);
  off::FrozenLayers base(thetad::comm::make_node_memory(), layer_parts(), *device, 2, 0,
                         off::LayerSource::node_shards);
  fill_pattern(base);
  walk_and_check(base, 2, device.get());
  EXPECT_EQ(base.stats().misses, 1u);
}
