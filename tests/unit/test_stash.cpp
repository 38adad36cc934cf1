// The decoder's stash (model/stash.h) on the cpu device: for each recompute granularity, with and
// without offload, fp32 and bf16 storage of an fp32 or a bf16 residual, it keeps exactly what
// the granularity asks for (residuals rounded to the stash dtype, the MLP's products, the
// attention's kept object), in the arena it says (device or host, tags stash and mlp, with one
// staging copy in forward when an offloaded residual changes dtype), hands each entry back on the
// device once fetched, and frees every byte by the drops.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <memory>

#include "backend/tensor_ops.h"
#include "model/stash.h"
#include "unit/scoped_env.h"

namespace upipe {
namespace {

constexpr int kLayers = 3;
constexpr int64_t kRows = 5, kHidden = 8, kInter = 12;

// A recognisable value for (layer, which residual, element i), not exact in bf16.
float value(int layer, int which, int64_t i) {
  return 1.0f + 0.1f * float(layer) + 0.01f * float(which) + 0.0013f * float(i);
}

std::vector<float> residual(int layer, int which) {
  std::vector<float> v(size_t(kRows * kHidden));
  for (size_t i = 0; i < v.size(); ++i) v[i] = value(layer, which, int64_t(i));
  return v;
}

float rounded(float v, DType t) {
  return t == DType::kF32 ? v : bf16_to_f32(f32_to_bf16(v));
}

// Counts the attention stashes alive, so a test sees the stash hand back (not free) its own.
struct FakeAttention final : AttentionStash {
  explicit FakeAttention(int* alive) : alive_(alive) { ++*alive_; }
  ~FakeAttention() override { --*alive_; }
  int* alive_;
};

struct Case {
  Recompute recompute;
  bool offload;
  DType stash, residual;
};

std::string name(const Case& c) {
  return fmt::format("{} offload={} stash={} residual={}", recompute_name(c.recompute), c.offload,
                     dtype_name(c.stash), dtype_name(c.residual));
}

void forward(Device& dev, Stash& st, const Case& c, int* alive) {
  const DType compute = DType::kBF16;
  Tensor x(dev.mem(), Tag::kAct, c.residual, kRows, kHidden);
  for (int l = 0; l < kLayers; ++l) {
    st.before_write(x);
    upload(dev, residual(l, 0).data(), x);
    st.save_input(l, x);
    if (st.keeps_mlp_input()) {
      st.before_write(x);
      upload(dev, residual(l, 1).data(), x);
      st.save_mlp_input(l, x);
    }
    if (st.keeps_intermediates()) st.keep_attention(l, std::make_unique<FakeAttention>(alive));
    const MlpStash* k = st.keep_mlp(l);
    ASSERT_EQ(k != nullptr, c.recompute == Recompute::kNone);
    if (k) {
      EXPECT_EQ(k->a.rows, kRows);
      EXPECT_EQ(k->a.cols, kInter);
      EXPECT_EQ(k->a.dtype, compute);
      fill(dev, k->a, float(l));
      fill(dev, k->b, float(l) + 0.5f);
    }
  }
}

// The residual as saved (rounded to the residual dtype) and stored (rounded to the stash dtype).
void expect_residual(Device& dev, const Mat& got, int layer, int which, const Case& c) {
  const std::vector<float> v = download(dev, got), want = residual(layer, which);
  ASSERT_EQ(v.size(), want.size());
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(v[i], rounded(rounded(want[i], c.residual), c.stash))
        << "layer " << layer << " residual " << which << " " << i;
}

TEST(Stash, KeepsWhatTheGranularityAsksForAndFreesIt) {
  for (Recompute r : {Recompute::kLayer, Recompute::kBlock, Recompute::kNone})
    for (bool offload : {false, true})
      for (DType stash : {DType::kF32, DType::kBF16})
        for (DType res : {DType::kF32, DType::kBF16}) {
          const Case c{r, offload, stash, res};
          SCOPED_TRACE(name(c));
          Device dev;
          Stash st(dev, {r, stash, offload}, {kLayers, kRows, kHidden, kInter, DType::kBF16});
          const int64_t k = r == Recompute::kLayer ? 1 : 2;  // residuals per layer
          const int64_t one = mat_bytes(kRows, kHidden, stash);
          const int64_t mlp =
              r == Recompute::kNone ? 2 * mat_bytes(kRows, kInter, DType::kBF16) : 0;
          dev.mem().reset_peak();
          int alive = 0;
          forward(dev, st, c, &alive);
          EXPECT_EQ(alive, r == Recompute::kNone ? kLayers : 0);
          Arena &mem = dev.mem(), &host = dev.host();
          EXPECT_EQ(mem.current_by_tag()[Tag::kStash], offload ? 0 : kLayers * k * one);
          EXPECT_EQ(host.current_by_tag()[Tag::kStash], offload ? kLayers * k * one : 0);
          EXPECT_EQ(mem.current_by_tag()[Tag::kMlp], kLayers * mlp);
          // Offloaded in another dtype: one staging copy at a time on the device.
          EXPECT_EQ(mem.peak_by_tag()[Tag::kStash],
                    offload ? (stash != res ? one : 0) : kLayers * k * one);
          for (int l = kLayers - 1; l >= 0; --l) {
            st.fetch(l);
            EXPECT_EQ(mem.current_by_tag()[Tag::kStash], offload ? k * one : (l + 1) * k * one);
            expect_residual(dev, st.input(l), l, 0, c);
            if (st.keeps_mlp_input()) {
              expect_residual(dev, st.mlp_input(l), l, 1, c);
              st.drop_mlp_input(l);
            }
            std::unique_ptr<AttentionStash> a = st.take_attention(l);
            EXPECT_EQ(a != nullptr, r == Recompute::kNone);
            EXPECT_EQ(st.take_attention(l), nullptr);
            a.reset();
            const MlpStash* kept = st.mlp(l);
            ASSERT_EQ(kept != nullptr, r == Recompute::kNone);
            if (kept) {
              EXPECT_EQ(download(dev, kept->a)[7], float(l));
              EXPECT_EQ(download(dev, kept->b.rows_of(kRows - 1, 1))[kInter - 1], float(l) + 0.5f);
            }
            st.drop_mlp(l);
            EXPECT_EQ(st.mlp(l), nullptr);
            EXPECT_EQ(mem.current_by_tag()[Tag::kMlp], l * mlp);
            st.drop_input(l);
            EXPECT_EQ(mem.current_by_tag()[Tag::kStash], offload ? 0 : l * k * one);
            EXPECT_EQ(host.current_by_tag()[Tag::kStash], offload ? l * k * one : 0);
          }
          EXPECT_EQ(alive, 0);
        }
}

// The stash as the residual stream's write fence, with the CPU's deferred copies (a copy runs only
// when waited on, the latest a GPU's copy lanes may run it): a save is copied in chunks of rows;
// before_write(rows) runs exactly the copies up to the newest one reading those rows, so rows
// written after their fence keep their saved values, and a chunk after them is still queued (a
// write to its rows without the fence shows in the saved copy: what a missing fence looks like).
TEST(Stash, FencesEachChunkOfAnOffloadedSaveUntilItsRowsAreWritten) {
  const ScopedEnv env("UPIPE_CPU_COPIES", "deferred");
  constexpr int64_t kRowsN = 7, kChunk = 2;  // chunks of rows [0,2) [2,4) [4,6) [6,7)
  Device dev({BackendKind::kCpu});
  Stash st(dev, {Recompute::kLayer, DType::kF32, true},
           {1, kRowsN, kHidden, kInter, DType::kF32, kChunk});
  Tensor x(dev.mem(), Tag::kAct, DType::kF32, kRowsN, kHidden);
  std::vector<float> v(size_t(kRowsN * kHidden));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  upload(dev, v.data(), x);
  st.save_input(0, x);
  auto write_rows = [&](int64_t r0, int64_t n, float value) {
    fill(dev, x.mat().rows_of(r0, n), value);
  };
  st.before_write(x.mat().rows_of(3, 1));  // row 3 is in the second chunk: two copies run
  write_rows(0, 4, -1.0f);
  st.before_write(x.mat().rows_of(0, 4));  // again: nothing left to wait for
  write_rows(6, 1, -3.0f);                 // unfenced: the last chunk's copy has not run
  st.before_write(x.mat().rows_of(4, 2));
  write_rows(4, 2, -2.0f);
  st.wait_saves();
  dev.backend().sync(Stream{});  // throws if a copy was never waited on
  st.fetch(0);
  const std::vector<float> got = download(dev, st.input(0));
  ASSERT_EQ(got.size(), v.size());
  for (size_t i = 0; i < size_t(6 * kHidden); ++i) ASSERT_EQ(got[i], v[i]) << "element " << i;
  for (size_t i = size_t(6 * kHidden); i < got.size(); ++i)
    ASSERT_EQ(got[i], -3.0f) << "element " << i << ": the last chunk ran before its fence";
  st.drop_input(0);
}

TEST(StashDeathTest, ReadingAnOffloadedEntryBeforeItsFetchIsAnError) {
  Device dev;
  Stash st(dev, {Recompute::kLayer, DType::kF32, true}, {1, kRows, kHidden, kInter, DType::kF32});
  Tensor x(dev.mem(), Tag::kAct, DType::kF32, kRows, kHidden);
  zero(dev, x);
  st.save_input(0, x);
  EXPECT_DEATH(st.input(0), "before it was saved or fetched");
  EXPECT_DEATH(st.input(1), "stash layer 1 of 1");
}

}  // namespace
}  // namespace upipe
