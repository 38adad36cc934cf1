// The CUDA GEMM's descriptor (src/backend/cuda/gemm_desc.h), without a GPU: the column-major
// problem handed to cuBLASLt is executed by a naive column-major GEMM written from cuBLAS's
// definition and must equal the row-major oracle on strided views with every transpose; the
// staging plan must cover exactly the dtype mixes cuBLASLt lacks.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cuda/gemm_desc.h"
#include "backend/reference/elementwise_ref.h"

namespace upipe::cuda {
namespace {

// cuBLAS's definition: D = alpha op(A) op(B) + beta C, column-major, element (i, j) of a matrix
// with leading dimension ld at i + j * ld; op(X) = X or X^T.
void colmajor_gemm(const LtProblem& p) {
  const float* a = static_cast<const float*>(p.a.ptr);
  const float* b = static_cast<const float*>(p.b.ptr);
  float* c = static_cast<float*>(const_cast<void*>(p.c.ptr));
  auto opa = [&](int64_t i, int64_t l) {
    return p.trans_a ? a[l + i * p.a.ld] : a[i + l * p.a.ld];
  };
  auto opb = [&](int64_t l, int64_t j) {
    return p.trans_b ? b[j + l * p.b.ld] : b[l + j * p.b.ld];
  };
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t i = 0; i < p.m; ++i) {
      double s = 0;
      for (int64_t l = 0; l < p.k; ++l) s += double(opa(i, l)) * opb(l, j);
      float& d = c[i + j * p.c.ld];
      d = float(p.alpha * s + (p.beta == 0 ? 0.0 : p.beta * double(d)));
    }
}

struct Strided {
  int64_t rows, cols, ld;
  std::vector<float> data;
  Strided(int64_t r, int64_t c, int64_t pad, std::mt19937& g) : rows(r), cols(c), ld(c + pad) {
    std::uniform_real_distribution<float> u(-1, 1);
    data.resize(size_t(r * ld));
    for (float& x : data) x = u(g);
  }
  DView view() { return {data.data(), DT::kF32, rows, cols, ld}; }
};

TEST(CudaGemmDesc, ColumnMajorProblemEqualsRowMajorGemm) {
  std::mt19937 g(7);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        const int64_t m = 13, n = 7, k = 5;
        Strided a(ta ? k : m, ta ? m : k, 3, g), b(tb ? n : k, tb ? k : n, 2, g), c(m, n, 4, g);
        std::vector<float> c0 = c.data;
        const LtProblem p = lt_problem(a.view(), ta, b.view(), tb, c.view(), 0.75f, beta);
        EXPECT_EQ(p.m, n);
        EXPECT_EQ(p.n, m);
        EXPECT_EQ(p.k, k);
        // Each layout fits its storage: a column-major (rows, cols, ld) matrix spans the view.
        for (const LtMatrix* x : {&p.a, &p.b, &p.c}) EXPECT_GE(x->ld, x->rows);
        EXPECT_EQ(p.trans_a ? p.a.cols : p.a.rows, p.m);
        EXPECT_EQ(p.trans_b ? p.b.rows : p.b.cols, p.n);
        colmajor_gemm(p);

        std::vector<double> want(size_t(m * n));
        std::vector<double> ad(a.data.begin(), a.data.end()), bd(b.data.begin(), b.data.end());
        ref::gemm<double>({ad.data(), a.rows, a.cols, a.ld}, ta, {bd.data(), b.rows, b.cols, b.ld},
                          tb, {want.data(), m, n, n});
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            const double expect = 0.75 * want[size_t(i * n + j)] + beta * c0[size_t(i * c.ld + j)];
            EXPECT_NEAR(c.data[size_t(i * c.ld + j)], expect, 1e-5)
                << "ta=" << ta << " tb=" << tb << " beta=" << beta << " at " << i << "," << j;
          }
        // The padding between rows is never written.
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = n; j < c.ld; ++j)
            EXPECT_EQ(c.data[size_t(i * c.ld + j)], c0[size_t(i * c.ld + j)]);
      }
}

TEST(CudaGemmDesc, StagingOnlyWhatCublasLtLacks) {
  const DT f = DT::kF32, h = DT::kBF16;
  const int64_t m = 100, n = 30, k = 70;
  // Native: fp32 x fp32 -> fp32, bf16 x bf16 -> fp32 or bf16: only cuBLASLt's scratch, one block.
  for (auto [a, b, c] : {std::tuple{f, f, f}, std::tuple{h, h, f}, std::tuple{h, h, h}}) {
    const GemmStaging s = gemm_staging(m, n, k, a, b, c);
    EXPECT_FALSE(s.widen_a || s.widen_b || s.stage_c);
    EXPECT_EQ(s.bytes, kLtWorkspaceBytes + kLtAlignSlack);
    EXPECT_EQ(s.mb, m);
    EXPECT_EQ(s.kp, k);
  }
  // fp32 x fp32 -> bf16: the product runs on an fp32 copy of C.
  GemmStaging s = gemm_staging(m, n, k, f, f, h);
  EXPECT_TRUE(s.stage_c);
  EXPECT_EQ(s.c_offset, kLtWorkspaceBytes);
  EXPECT_EQ(s.bytes, kLtWorkspaceBytes + round_up_256(m * n * 4) + kLtAlignSlack);
  // Mixed operands: the bf16 one is widened; with a bf16 C, C is staged too. Regions are
  // disjoint, 256-byte aligned and inside the workspace.
  s = gemm_staging(m, n, k, h, f, h);
  EXPECT_TRUE(s.widen_a && !s.widen_b && s.stage_c);
  EXPECT_EQ(s.a_offset % 256, 0);
  EXPECT_EQ(s.c_offset, s.a_offset + round_up_256(m * k * 4));
  EXPECT_EQ(s.bytes, s.c_offset + round_up_256(m * n * 4) + kLtAlignSlack);
  s = gemm_staging(m, n, k, f, h, f);
  EXPECT_TRUE(!s.widen_a && s.widen_b && !s.stage_c);
  EXPECT_EQ(s.bytes, s.b_offset + round_up_256(k * n * 4) + kLtAlignSlack);
}

// cublasLtMatmul refuses a workspace that is not 256-byte aligned; the arena hands out 64-byte
// aligned blocks. From every 64-byte offset the layout's origin is 256-aligned and the layout
// (its bytes less the slack) still ends inside the block.
TEST(CudaGemmDesc, WorkspaceOriginIs256AlignedInsideTheBlock) {
  alignas(256) static char block[1024];
  const GemmStaging s = gemm_staging(100, 30, 70, DT::kBF16, DT::kF32, DT::kBF16);
  for (int off = 0; off < 256; off += 64) {
    char* const base = ws_base(block + off);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % 256, 0u) << off;
    EXPECT_GE(base, block + off);
    EXPECT_LE((base - (block + off)) + (s.bytes - kLtAlignSlack), s.bytes) << off;
  }
}

// The staging is bounded: a weight gradient of a million-token shard (bf16 X^T times fp32 dY)
// takes at most kStageBytes per staged copy, whatever S is.
TEST(CudaGemmDesc, StagingDoesNotGrowWithTheSequence) {
  for (int64_t rows : {int64_t(1) << 12, int64_t(1) << 16, int64_t(1) << 20}) {
    const GemmStaging s = gemm_staging(4096, 4096, rows, DT::kBF16, DT::kF32, DT::kF32);
    EXPECT_TRUE(s.widen_a);
    EXPECT_LE(s.bytes, kLtWorkspaceBytes + kStageBytes + kLtAlignSlack) << rows;
    const GemmStaging c = gemm_staging(rows, 4096, 4096, DT::kF32, DT::kF32, DT::kBF16);
    EXPECT_LE(c.bytes, kLtWorkspaceBytes + kStageBytes + kLtAlignSlack) << rows;
  }
}

// The blocked product (row blocks of C when C is staged, K panels when an operand is widened,
// beta on each block's first panel and 1 after) equals the whole product, with tiny budgets that
// force many uneven blocks, every transpose and beta, on strided views.
TEST(CudaGemmDesc, BlockedProductEqualsTheWholeOne) {
  std::mt19937 g(11);
  const DT f = DT::kF32, h = DT::kBF16;
  for (auto [da, db, dc] : {std::tuple{h, f, f}, std::tuple{f, h, h}, std::tuple{f, f, h}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 1.0f, -0.5f})
          for (int64_t budget : {int64_t(2) << 10, int64_t(3) << 10}) {
            const int64_t m = 37, n = 29, k = 53;
            Strided a(ta ? k : m, ta ? m : k, 3, g), b(tb ? n : k, tb ? k : n, 1, g), c(m, n, 5, g);
            const std::vector<float> c0 = c.data;
            const GemmStaging st = gemm_staging(m, n, k, da, db, dc, budget);
            ASSERT_TRUE(st.mb < m || st.kp < k) << "the budget must force blocking";
            int blocks = 0;
            for_each_gemm_block(m, k, st, [&](const GemmBlock& blk) {
              // fp32 data stand in for both dtypes: the test is of the index arithmetic.
              const DView av = a_block(a.view(), ta, blk), bv = b_block(b.view(), tb, blk);
              const DView cv = rows_view(c.view(), blk.r0, blk.rows);
              EXPECT_EQ(ta ? av.cols : av.rows, blk.rows);
              EXPECT_EQ(ta ? av.rows : av.cols, blk.kp);
              EXPECT_EQ(tb ? bv.cols : bv.rows, blk.kp);
              colmajor_gemm(lt_problem(av, ta, bv, tb, cv, 1.0f, blk.first_panel ? beta : 1.0f));
              ++blocks;
            });
            EXPECT_GT(blocks, 1);
            std::vector<double> want(size_t(m * n));
            std::vector<double> ad(a.data.begin(), a.data.end()), bd(b.data.begin(), b.data.end());
            ref::gemm<double>({ad.data(), a.rows, a.cols, a.ld}, ta,
                              {bd.data(), b.rows, b.cols, b.ld}, tb, {want.data(), m, n, n});
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j)
                ASSERT_NEAR(c.data[size_t(i * c.ld + j)],
                            want[size_t(i * n + j)] + beta * c0[size_t(i * c.ld + j)], 1e-4)
                    << "ta=" << ta << " tb=" << tb << " beta=" << beta << " budget=" << budget
                    << " at " << i << "," << j;
          }
}

}  // namespace
}  // namespace upipe::cuda
