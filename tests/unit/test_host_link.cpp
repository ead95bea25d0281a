// HostLink (zero/host_link.h) on device memory the host cannot touch (the walled backend), with
// the host slow on purpose: after each next_grads() the test sleeps before it reads the buffer, so
// a download queued too early into a buffer still being read would overwrite it under the reader,
// and an upload buffer handed out again too early would be changed under its copy. Spans of uneven
// sizes over gradient pieces scattered across two device buffers, every depth from 1 to 3, two
// passes each (the second reuses every buffer).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "zero/host_link.h"

using namespace zero3d;

TEST(HostLink, GradientsComeDownAndWeightsGoUpSpanBySpan) {
  auto dev = make_walled_backend();
  const size_t n = 10000, split = 6000;  // state [0, split) lies in `a` (at offset 100), the rest in `b`
  std::vector<float> grads(n);
  for (size_t i = 0; i < n; ++i) grads[i] = static_cast<float>(i) + 0.5f;
  DeviceBuffer<float> a(*dev, split + 100), b(*dev, n - split);
  dev->copy_from_host(a.data() + 100, grads.data(), split * sizeof(float));
  dev->copy_from_host(b.data(), grads.data() + split, (n - split) * sizeof(float));
  std::vector<HostLink::Grads> pieces;  // 700 elements each, cut at the split
  for (size_t at = 0; at < n;) {
    const size_t end = std::min({at + 700, n, at < split ? split : n});
    pieces.push_back({at, end - at, at < split ? a.data() + 100 + at : b.data() + (at - split)});
    at = end;
  }
  const std::vector<ShardInfo> spans = {{0, 1500},    {1500, 1500}, {3000, 1000}, {4000, 1500},
                                        {5500, 1500}, {7000, 1500}, {8500, 1500}};
  for (int depth = 1; depth <= 3; ++depth) {
    HostLink link(*dev);
    link.reserve(spans, depth);
    link.set_gradients(pieces);
    DeviceBuffer<float> weights(*dev, n);
    for (int pass = 0; pass < 2; ++pass) {
      link.begin();
      for (const ShardInfo& s : spans) {
        const float* g = link.next_grads();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the copy thread runs ahead meanwhile
        int wrong = 0;
        for (size_t i = 0; i < s.size; ++i) wrong += g[i] != grads[s.offset + i];
        EXPECT_EQ(wrong, 0) << "depth " << depth << " pass " << pass << " span at " << s.offset;
        auto* w = reinterpret_cast<float*>(link.upload_buffer());
        for (size_t i = 0; i < s.size; ++i) w[i] = 2 * g[i] + static_cast<float>(pass);
        link.upload(weights.data() + s.offset, w, s.size * sizeof(float));
      }
      link.finish();
      std::vector<float> got(n);
      dev->copy_to_host(got.data(), weights.data(), n * sizeof(float));
      int wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += got[i] != 2 * grads[i] + static_cast<float>(pass);
      EXPECT_EQ(wrong, 0) << "depth " << depth << " pass " << pass << ": weights on the device";
    }
    const HostLink::Stats st = link.take_stats();
    EXPECT_EQ(st.bytes_down, 2 * n * sizeof(float));
    EXPECT_EQ(st.bytes_up, 2 * n * sizeof(float));
  }
}
