// The flash attention kernels against the naive fp64 reference, with tolerances from a rule:
// the fast kernel's error must be within 2x the error of a same-precision naive baseline (plus
// a floor of a few ulp of the output's magnitude), as in flash-attention's tests. Also:
// finite-difference gradients, the head-split reduction-order contract (bitwise), block-wise
// accumulation and log-sum-exp merging, determinism, and exact workspace bytes. Packed documents:
// document-causal attention against the reference's per-row mask on every kernel path (whole
// sequences and ring-like pieces of documents on sub-views), one document bitwise equal to the
// causal kernel, a document's results bitwise independent of the other documents' values, and
// rows with no key of their document -inf / 0.
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "backend/attention.h"
#include "backend/cpu/attention_mask.h"
#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/cpu_isa.h"
#include "backend/reference/attention_ref.h"
#include "common/test_util.h"

namespace upipe {
namespace {

using test::read;

// Documents of a view: its span list (rows numbered in the list) and the list row of view row 0.
struct ViewDocs {
  std::vector<DocSpan> spans;
  int64_t row0 = 0;
  DocRows rows() const { return {spans.data(), int64_t(spans.size()), row0}; }
  // The document and position of each of the view's n rows.
  void expand(int64_t n, std::vector<int64_t>& doc, std::vector<int64_t>& pos) const {
    doc.assign(size_t(n), -1);
    pos.assign(size_t(n), -1);
    for (const DocSpan& sp : spans)
      for (int64_t r = 0; r < sp.rows; ++r) {
        const int64_t i = sp.row + r - row0;
        if (i < 0 || i >= n) continue;
        doc[size_t(i)] = sp.doc;
        pos[size_t(i)] = sp.pos + r;
      }
  }
};

// Spans of a whole sequence of documents of these lengths (document i is id i).
ViewDocs packed_docs(std::initializer_list<int64_t> lens) {
  ViewDocs v;
  int64_t row = 0, doc = 0;
  for (int64_t l : lens) {
    v.spans.push_back({row, l, doc++, 0});
    row += l;
  }
  return v;
}

struct Case {
  int64_t sq, sk;
  int hq, hk, d;
  int64_t q_pos0, k_pos0;
  bool causal;
  DType dtype;
  ViewDocs qd = {}, kd = {};  // documents (both or neither)
  std::string tag = {};       // names a documents case
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  return fmt::format("sq{}_sk{}_h{}_{}_d{}_qp{}_kp{}_{}_{}{}", c.sq, c.sk, c.hq, c.hk, c.d,
                     c.q_pos0, c.k_pos0, c.causal ? "causal" : "full", dtype_name(c.dtype),
                     c.tag.empty() ? "" : "_" + c.tag);
}

// Inputs, the fast results and the fp64 / same-precision references of one case.
struct Inputs {
  std::vector<double> q, k, v, dout;  // values as stored (already rounded to dtype)
  ref::AttnDims dims;
};

Inputs make_inputs(const Case& c, Device& dev, Tensor& q, Tensor& k, Tensor& v, Tensor& dout) {
  q = Tensor(dev.mem(), Tag::kQkv, c.dtype, c.sq, c.hq * c.d);
  k = Tensor(dev.mem(), Tag::kQkv, c.dtype, c.sk, c.hk * c.d);
  v = Tensor(dev.mem(), Tag::kQkv, c.dtype, c.sk, c.hk * c.d);
  dout = Tensor(dev.mem(), Tag::kAttnGrad, c.dtype, c.sq, c.hq * c.d);
  test::fill_normal(q, 11);
  test::fill_normal(k, 12);
  test::fill_normal(v, 13);
  test::fill_normal(dout, 14);
  Inputs r{read(q), read(k), read(v), read(dout), {}};
  r.dims = ref::AttnDims{c.sq, c.sk, c.hq, c.hk, c.d, c.q_pos0, c.k_pos0, c.causal};
  if (!c.qd.spans.empty()) {
    c.qd.expand(c.sq, r.dims.q_doc, r.dims.q_pos);
    c.kd.expand(c.sk, r.dims.k_doc, r.dims.k_pos);
  }
  return r;
}

AttnProblem problem_of(const Case& c, const Mat& q, const Mat& k, const Mat& v) {
  AttnProblem p{q, k, v, c.hq, c.hk, c.d, c.q_pos0, c.k_pos0, c.causal};
  if (!c.qd.spans.empty()) {
    p.q_docs = c.qd.rows();
    p.k_docs = c.kd.rows();
  }
  return p;
}

using test::cast;

// The fast kernels' o, lse, dq, dk, dv of case c against the fp64 reference, within twice the
// error of the same-precision naive baseline plus 4 fp32 ulp of the largest value.
void expect_within_baseline(const Case& c) {
  Device dev;
  Tensor q, k, v, dout;
  Inputs in = make_inputs(c, dev, q, k, v, dout);
  const int64_t qc = c.hq * c.d, kc = c.hk * c.d;

  // Fast kernel.
  Tensor o(dev.mem(), Tag::kAttnOut, c.dtype, c.sq, qc);
  Tensor lse(dev.mem(), Tag::kAttnOut, DType::kF32, c.hq, c.sq);
  const AttnProblem p = problem_of(c, q, k, v);
  const int64_t before = dev.mem().current();
  dev.mem().reset_peak();
  attention_forward(dev, p, o, lse);
  EXPECT_EQ(dev.mem().peak() - before,
            attention_fwd_workspace_bytes(dev.backend(), c.hq, c.hk, c.d, c.dtype));
  Tensor delta(dev.mem(), Tag::kAttnGrad, DType::kF32, c.hq, c.sq);
  attention_delta(dev, o, dout, c.d, delta);
  Tensor dq(dev.mem(), Tag::kAttnGrad, DType::kF32, c.sq, qc);
  Tensor dk(dev.mem(), Tag::kAttnGrad, DType::kF32, c.sk, kc);
  Tensor dv(dev.mem(), Tag::kAttnGrad, DType::kF32, c.sk, kc);
  test::fill_value(dq, 0);
  test::fill_value(dk, 0);
  test::fill_value(dv, 0);
  const int64_t before_b = dev.mem().current();
  dev.mem().reset_peak();
  attention_backward(dev, p, dout, lse, delta, dq, dk, dv);
  EXPECT_EQ(dev.mem().peak() - before_b,
            attention_bwd_workspace_bytes(dev.backend(), c.hq, c.hk, c.d, c.dtype));

  // fp64 reference and the same-precision (fp32 math, outputs stored like the fast kernel's)
  // naive baseline, on the same stored inputs.
  std::vector<double> o64(size_t(c.sq * qc)), lse64(size_t(c.hq * c.sq));
  std::vector<double> dq64(size_t(c.sq * qc)), dk64(size_t(c.sk * kc)), dv64(size_t(c.sk * kc));
  using test::cview;
  using test::view;
  ref::attention_forward<double>(in.dims, cview(in.q, c.sq, qc), cview(in.k, c.sk, kc),
                                 cview(in.v, c.sk, kc), view(o64, c.sq, qc),
                                 view(lse64, c.hq, c.sq));
  ref::attention_backward<double>(in.dims, cview(in.q, c.sq, qc), cview(in.k, c.sk, kc),
                                  cview(in.v, c.sk, kc), cview(in.dout, c.sq, qc),
                                  view(dq64, c.sq, qc), view(dk64, c.sk, kc), view(dv64, c.sk, kc));
  auto q32 = cast<float>(in.q), k32 = cast<float>(in.k), v32 = cast<float>(in.v),
       d32 = cast<float>(in.dout);
  std::vector<float> o32(o64.size()), lse32(lse64.size()), dq32(dq64.size(), 0.f),
      dk32(dk64.size(), 0.f), dv32(dv64.size(), 0.f);
  // bf16 attention's precision: every product has bf16 operands (also the computed P and dS,
  // rounded as the kernels round them for their dot products) and fp32 accumulation.
  auto stored = [&](float x) { return c.dtype == DType::kF32 ? x : bf16_to_f32(f32_to_bf16(x)); };
  ref::attention_forward<float>(in.dims, cview(q32, c.sq, qc), cview(k32, c.sk, kc),
                                cview(v32, c.sk, kc), view(o32, c.sq, qc), view(lse32, c.hq, c.sq),
                                stored);
  ref::attention_backward<float>(in.dims, cview(q32, c.sq, qc), cview(k32, c.sk, kc),
                                 cview(v32, c.sk, kc), cview(d32, c.sq, qc), view(dq32, c.sq, qc),
                                 view(dk32, c.sk, kc), view(dv32, c.sk, kc), stored, stored);
  const std::vector<double> o_base = test::rounded(cast<double>(o32), c.dtype);

  auto check = [&](const char* what, const std::vector<double>& fast,
                   const std::vector<double>& r64, const std::vector<double>& base) {
    const double err = test::max_abs_diff(fast, r64), base_err = test::max_abs_diff(base, r64);
    const double floor = 4 * std::numeric_limits<float>::epsilon() * test::max_abs(r64);
    EXPECT_LE(err, 2 * base_err + floor) << what << ": fast " << err << " baseline " << base_err;
  };
  check("o", read(o), o64, o_base);
  check("lse", read(lse), lse64, cast<double>(lse32));
  check("dq", read(dq), dq64, cast<double>(dq32));
  check("dk", read(dk), dk64, cast<double>(dk32));
  check("dv", read(dv), dv64, cast<double>(dv32));
}

class AttnKernel : public ::testing::TestWithParam<Case> {};

TEST_P(AttnKernel, ForwardAndBackwardWithinTwiceBaselineError) {
  expect_within_baseline(GetParam());
}

const DType F = DType::kF32, B = DType::kBF16;
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttnKernel,
    ::testing::Values(
        Case{300, 300, 2, 2, 32, 0, 0, true, F},       // MHA, ragged tiles
        Case{700, 700, 4, 1, 64, 0, 0, true, F},       // GQA G=4, several key tiles
        Case{256, 256, 8, 2, 16, 0, 0, false, F},      // non-causal
        Case{200, 150, 2, 1, 32, 1000, 900, true, F},  // block with global offsets
        Case{130, 140, 2, 2, 32, 0, 200, true, F},     // keys all in the future: no key visible
        Case{96, 600, 2, 1, 32, 500, 0, true, F},      // queries late, keys early (ring block)
        Case{300, 300, 4, 2, 64, 0, 0, true, B},       // bf16 storage
        Case{170, 230, 3, 1, 20, 60, 0, true, F},      // d not a multiple of 8, G=3
        Case{250, 333, 2, 1, 40, 100, 17, true, B}),   // bf16, ragged, offsets, d=40
    case_name);

// The contract on every path this CPU supports (cpu_isa.h), in fp32 and bf16 (on avx512bf16 the
// bf16 dot-product kernels, on amx their products on AMX tiles).
struct PathCase {
  CpuIsa isa;
  DType dtype;
};
std::vector<PathCase> path_cases() {
  std::vector<PathCase> v;
  for (CpuIsa isa : supported_cpu_isas())
    for (DType t : {DType::kF32, DType::kBF16}) v.push_back({isa, t});
  return v;
}
class AttnKernelPath : public ::testing::TestWithParam<PathCase> {
 protected:
  void SetUp() override {
    before_ = cpu_isa();
    set_cpu_isa(GetParam().isa);
  }
  void TearDown() override { set_cpu_isa(before_); }

 private:
  CpuIsa before_ = CpuIsa::kAvx2;
};

// Plain blocks on every path: tiles cut anywhere, several key and query tiles in both passes,
// global offsets, non-causal, and the head dimensions the amx path takes on tiles (multiples of
// 32) next to one it does not.
TEST_P(AttnKernelPath, BlocksWithinTwiceBaselineError) {
  const DType t = GetParam().dtype;
  for (const Case& c : {Case{800, 800, 2, 1, 64, 0, 0, true, t},     // query tiles of both passes
                        Case{213, 600, 2, 1, 128, 400, 0, true, t},  // d = 128, ring-like block
                        Case{200, 150, 2, 2, 32, 1000, 900, true, t},
                        Case{130, 300, 2, 1, 64, 0, 0, false, t},  // non-causal
                        Case{97, 97, 2, 1, 48, 0, 0, true, t}}) {  // d % 32 != 0
    SCOPED_TRACE(::testing::Message() << c.sq << "x" << c.sk << " d=" << c.d);
    expect_within_baseline(c);
  }
}

// The reduction-order contract: computing a subset of heads (as a head-sharded strategy does)
// gives bitwise the values of the all-heads call.
TEST_P(AttnKernelPath, HeadSubsetIsBitwiseEqual) {
  const DType t = GetParam().dtype;
  Device dev;
  const int hq = 8, hk = 2, d = 32;
  const int64_t s = 520;
  Tensor q, k, v, dout;
  make_inputs({s, s, hq, hk, d, 0, 0, true, t}, dev, q, k, v, dout);
  Tensor o(dev.mem(), Tag::kAttnOut, t, s, hq * d),
      lse(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s);
  attention_forward(dev, {q, k, v, hq, hk, d}, o, lse);
  Tensor delta(dev.mem(), Tag::kAttnGrad, DType::kF32, hq, s);
  attention_delta(dev, o, dout, d, delta);
  Tensor dq(dev.mem(), Tag::kAttnGrad, DType::kF32, s, hq * d),
      dk(dev.mem(), Tag::kAttnGrad, DType::kF32, s, hk * d),
      dv(dev.mem(), Tag::kAttnGrad, DType::kF32, s, hk * d);
  test::fill_value(dq, 0);
  test::fill_value(dk, 0);
  test::fill_value(dv, 0);
  attention_backward(dev, {q, k, v, hq, hk, d}, dout, lse, delta, dq, dk, dv);

  // Heads 4..7 read KV head 1: run them alone through strided views of the same buffers.
  const Mat qs = q.mat().cols_of(4 * d, 4 * d), ks = k.mat().cols_of(d, d),
            vs = v.mat().cols_of(d, d);
  Tensor o2(dev.mem(), Tag::kAttnOut, t, s, 4 * d),
      lse2(dev.mem(), Tag::kAttnOut, DType::kF32, 4, s);
  AttnProblem p2{qs, ks, vs, 4, 1, d};
  attention_forward(dev, p2, o2, lse2);
  EXPECT_EQ(read(o2), read(o.mat().cols_of(4 * d, 4 * d)));
  EXPECT_EQ(read(lse2), read(lse.mat().rows_of(4, 4)));
  Tensor dq2(dev.mem(), Tag::kAttnGrad, DType::kF32, s, 4 * d),
      dk2(dev.mem(), Tag::kAttnGrad, DType::kF32, s, d),
      dv2(dev.mem(), Tag::kAttnGrad, DType::kF32, s, d);
  test::fill_value(dq2, 0);
  test::fill_value(dk2, 0);
  test::fill_value(dv2, 0);
  attention_backward(dev, p2, dout.mat().cols_of(4 * d, 4 * d), lse2, delta.mat().rows_of(4, 4),
                     dq2, dk2, dv2);
  EXPECT_EQ(read(dq2), read(dq.mat().cols_of(4 * d, 4 * d)));
  EXPECT_EQ(read(dk2), read(dk.mat().cols_of(d, d)));
  EXPECT_EQ(read(dv2), read(dv.mat().cols_of(d, d)));
}

// The other half of the contract: a query view that is a prefix of another (same first row, same
// keys) gives bitwise the same o, lse and dq for its rows.
TEST_P(AttnKernelPath, QueryPrefixIsBitwiseEqual) {
  const DType t = GetParam().dtype;
  Device dev;
  const int hq = 4, hk = 2, d = 64;
  const int64_t s = 700, s2 = 307;
  Tensor q, k, v, dout;
  make_inputs({s, s, hq, hk, d, 0, 0, true, t}, dev, q, k, v, dout);
  auto run = [&](int64_t rows, Tensor& o, Tensor& lse, Tensor& dq) {
    o = Tensor(dev.mem(), Tag::kAttnOut, t, rows, hq * d);
    lse = Tensor(dev.mem(), Tag::kAttnOut, DType::kF32, hq, rows);
    const AttnProblem p{q.mat().rows_of(0, rows), k, v, hq, hk, d};
    attention_forward(dev, p, o, lse);
    Tensor delta(dev.mem(), Tag::kAttnGrad, DType::kF32, hq, rows);
    attention_delta(dev, o, dout.mat().rows_of(0, rows), d, delta);
    dq = Tensor(dev.mem(), Tag::kAttnGrad, DType::kF32, rows, hq * d);
    Tensor dk(dev.mem(), Tag::kAttnGrad, DType::kF32, s, hk * d),
        dv(dev.mem(), Tag::kAttnGrad, DType::kF32, s, hk * d);
    test::fill_value(dq, 0);
    test::fill_value(dk, 0);
    test::fill_value(dv, 0);
    attention_backward(dev, p, dout.mat().rows_of(0, rows), lse, delta, dq, dk, dv);
  };
  Tensor o, lse, dq, o2, lse2, dq2;
  run(s, o, lse, dq);
  run(s2, o2, lse2, dq2);
  EXPECT_EQ(read(o2), read(o.mat().rows_of(0, s2)));
  EXPECT_EQ(read(lse2), read(lse.mat().cols_of(0, s2)));
  EXPECT_EQ(read(dq2), read(dq.mat().rows_of(0, s2)));
}

// Packed documents: whole sequences (documents of length 1, lengths off every tile and panel
// boundary, one longer than the forward's query tile) and ring-like pieces (a sub-view of a
// query list, a key view holding two non-adjacent pieces of one document, a query document with
// no key in the block).
std::vector<Case> document_cases(DType t) {
  Case whole{700, 700,    4, 2, 32, 0, 0, true, t, packed_docs({1, 5, 130, 1, 300, 17, 246}),
             {},  "whole"};
  whole.kd = whole.qd;
  Case longer{1700, 1700, 2, 1, 16, 0, 0, true, t, packed_docs({900, 1, 1, 798}), {}, "long"};
  longer.kd = longer.qd;
  Case pieces{160, 230, 2, 1, 32, 0, 0, true, t, {}, {}, "pieces"};
  pieces.qd = {{{0, 30, 1, 5}, {30, 50, 3, 10}, {80, 100, 5, 0}}, 10};
  pieces.kd = {{{0, 40, 2, 0}, {40, 30, 3, 0}, {70, 40, 3, 80}, {110, 100, 5, 50}, {210, 20, 7, 0}},
               0};
  return {whole, longer, pieces};
}

TEST_P(AttnKernelPath, DocumentsWithinTwiceBaselineError) {
  for (const Case& c : document_cases(GetParam().dtype)) {
    SCOPED_TRACE(c.tag);
    expect_within_baseline(c);
  }
}

// Forward and backward of case c on the given inputs: o, lse, dq, dk, dv read back.
std::vector<std::vector<double>> run_case(Device& dev, const Case& c, const Tensor& q,
                                          const Tensor& k, const Tensor& v, const Tensor& dout) {
  const AttnProblem p = problem_of(c, q, k, v);
  Tensor o(dev.mem(), Tag::kAttnOut, c.dtype, c.sq, c.hq * c.d),
      lse(dev.mem(), Tag::kAttnOut, DType::kF32, c.hq, c.sq);
  attention_forward(dev, p, o, lse);
  Tensor delta(dev.mem(), Tag::kAttnGrad, DType::kF32, c.hq, c.sq);
  attention_delta(dev, o, dout, c.d, delta);
  Tensor dq(dev.mem(), Tag::kAttnGrad, DType::kF32, c.sq, c.hq * c.d),
      dk(dev.mem(), Tag::kAttnGrad, DType::kF32, c.sk, c.hk * c.d),
      dv(dev.mem(), Tag::kAttnGrad, DType::kF32, c.sk, c.hk * c.d);
  test::fill_value(dq, 0);
  test::fill_value(dk, 0);
  test::fill_value(dv, 0);
  attention_backward(dev, p, dout, lse, delta, dq, dk, dv);
  return {read(o), read(lse), read(dq), read(dk), read(dv)};
}

// One document covering the view runs the causal kernel's arithmetic: bitwise equal.
TEST_P(AttnKernelPath, OneDocumentIsBitwiseTheCausalKernel) {
  const DType t = GetParam().dtype;
  Device dev;
  Case plain{900, 900, 4, 2, 32, 0, 0, true, t};
  Case one = plain;
  one.qd = one.kd = packed_docs({900});
  Tensor q, k, v, dout;
  make_inputs(plain, dev, q, k, v, dout);
  EXPECT_EQ(run_case(dev, one, q, k, v, dout), run_case(dev, plain, q, k, v, dout));
}

// Changing the values of one document changes nothing, bitwise, in the other documents' rows:
// o, lse, dq of their queries and dk, dv of their keys.
TEST_P(AttnKernelPath, OtherDocumentsAreBitwiseUnchanged) {
  const DType t = GetParam().dtype;
  Device dev;
  Case c{900, 900, 4, 2, 32, 0, 0, true, t, packed_docs({200, 433, 1, 266}), {}, "isolated"};
  c.kd = c.qd;
  Tensor q, k, v, dout;
  make_inputs(c, dev, q, k, v, dout);
  const auto before = run_case(dev, c, q, k, v, dout);
  const int64_t a = 200, n = 433;  // document 1
  for (const Tensor* x : {&q, &k, &v, &dout}) test::fill_normal(x->mat().rows_of(a, n), 99);
  const auto after = run_case(dev, c, q, k, v, dout);
  const int64_t cols[] = {c.hq * c.d, 1, c.hq * c.d, c.hk * c.d, c.hk * c.d};
  int changed = 0;
  for (size_t i = 0; i < before.size(); ++i)
    for (int64_t r = 0; r < c.sq; ++r) {
      const bool mine = r >= a && r < a + n;
      for (int64_t col = 0; col < (i == 1 ? c.hq : cols[i]); ++col) {
        // lse is (hq, sq): element (h, r); the others (rows, cols): element (r, col).
        const size_t at = i == 1 ? size_t(col * c.sq + r) : size_t(r * cols[i] + col);
        if (mine)
          changed += before[i][at] != after[i][at];
        else
          ASSERT_EQ(before[i][at], after[i][at]) << "tensor " << i << " row " << r;
      }
    }
  EXPECT_GT(changed, 0) << "the perturbed document's own results must change";
}

// A query row whose document has no key in the block (a ring step): lse -inf, o 0, dq 0.
TEST_P(AttnKernelPath, RowsWithoutTheirDocumentSeeNothing) {
  const DType t = GetParam().dtype;
  Device dev;
  Case c = document_cases(t)[2];  // "pieces": its first 20 view rows are document 1, absent in k
  Tensor q, k, v, dout;
  make_inputs(c, dev, q, k, v, dout);
  const auto r = run_case(dev, c, q, k, v, dout);
  for (int64_t i = 0; i < 20; ++i) {
    for (int h = 0; h < c.hq; ++h)
      EXPECT_EQ(r[1][size_t(h * c.sq + i)], -std::numeric_limits<double>::infinity());
    for (int64_t col = 0; col < c.hq * c.d; ++col) {
      EXPECT_EQ(r[0][size_t(i * c.hq * c.d + col)], 0.0);
      EXPECT_EQ(r[2][size_t(i * c.hq * c.d + col)], 0.0);
    }
  }
}

// The tile decisions' inputs (cpu/attention_mask.h) against the visibility rule row by row, on
// random span lists of sub-views: each query row's key range is exactly its visible keys (one
// contiguous range, empty when none), both bounds never decrease, and query_rows holds every row
// that sees a key of a tile.
TEST(AttnKernelMask, KeyRangesAreExactlyTheVisibleKeys) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    // Query and key lists over documents 0..7: pieces in (document, position) order.
    auto list = [&](int64_t& rows) {
      ViewDocs v;
      rows = 0;
      int64_t pos = 0;
      for (int64_t doc = 0; doc < 8; ++doc) {
        if (rng() % 3 == 0) continue;
        pos = int64_t(rng() % 20);
        for (int piece = 0; piece < 1 + int(rng() % 2); ++piece) {
          const int64_t n = int64_t(rng() % 40) + 1;
          v.spans.push_back({rows, n, doc, pos});
          rows += n;
          pos += n + int64_t(rng() % 30);
        }
      }
      return v;
    };
    int64_t nq = 0, nk = 0;
    ViewDocs qd = list(nq), kd = list(nk);
    if (nq < 4 || nk < 4) continue;
    qd.row0 = int64_t(rng() % uint64_t(nq / 2));  // a sub-view of the query list
    const int64_t sq = nq - qd.row0, sk = nk;
    AttnProblem p{Mat{nullptr, DType::kF32, sq, 16, 16},
                  Mat{nullptr, DType::kF32, sk, 16, 16},
                  Mat{nullptr, DType::kF32, sk, 16, 16},
                  1,
                  1,
                  16};
    p.q_docs = qd.rows();
    p.k_docs = kd.rows();
    std::vector<int64_t> qdoc, qpos, kdoc, kpos;
    qd.expand(sq, qdoc, qpos);
    kd.expand(sk, kdoc, kpos);
    std::vector<int64_t> lo(static_cast<size_t>(sq)), hi(static_cast<size_t>(sq));
    cpu::key_ranges(p, 0, sq, lo.data(), hi.data());
    for (int64_t i = 0; i < sq; ++i) {
      for (int64_t j = 0; j < sk; ++j) {
        const bool vis = qdoc[size_t(i)] == kdoc[size_t(j)] && kpos[size_t(j)] <= qpos[size_t(i)];
        ASSERT_EQ(vis, j >= lo[size_t(i)] && j < hi[size_t(i)])
            << "trial " << trial << " row " << i << " key " << j;
      }
      if (i > 0 && lo[size_t(i)] < hi[size_t(i)]) {
        EXPECT_GE(hi[size_t(i)], hi[size_t(i - 1)]);
        if (lo[size_t(i - 1)] < hi[size_t(i - 1)]) {
          EXPECT_GE(lo[size_t(i)], lo[size_t(i - 1)]);
        }
      }
    }
    for (int64_t j0 = 0; j0 < sk; j0 += 16) {
      const int64_t n = std::min<int64_t>(16, sk - j0);
      const cpu::RowRange rows = cpu::query_rows(p, j0, n);
      for (int64_t i = 0; i < sq; ++i)
        if (lo[size_t(i)] < std::min(hi[size_t(i)], j0 + n) && hi[size_t(i)] > j0) {
          EXPECT_TRUE(i >= rows.first && i < rows.end) << "trial " << trial << " tile " << j0;
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, AttnKernelPath, ::testing::ValuesIn(path_cases()),
                         [](const auto& i) {
                           return std::string(cpu_isa_name(i.param.isa)) + "_" +
                                  dtype_name(i.param.dtype);
                         });

// Same inputs, same bits, run to run.
TEST(AttnKernelContract, Deterministic) {
  Device dev;
  const int64_t s = 333;
  Tensor q(dev.mem(), Tag::kQkv, DType::kF32, s, 64), k(dev.mem(), Tag::kQkv, DType::kF32, s, 32),
      v(dev.mem(), Tag::kQkv, DType::kF32, s, 32);
  test::fill_normal(q, 5);
  test::fill_normal(k, 6);
  test::fill_normal(v, 7);
  Tensor o1(dev.mem(), Tag::kAttnOut, DType::kF32, s, 64),
      o2(dev.mem(), Tag::kAttnOut, DType::kF32, s, 64),
      l1(dev.mem(), Tag::kAttnOut, DType::kF32, 2, s),
      l2(dev.mem(), Tag::kAttnOut, DType::kF32, 2, s);
  attention_forward(dev, {q, k, v, 2, 1, 32}, o1, l1);
  attention_forward(dev, {q, k, v, 2, 1, 32}, o2, l2);
  EXPECT_EQ(read(o1), read(o2));
  EXPECT_EQ(read(l1), read(l2));
}

// Splitting the keys into blocks: online accumulation across calls and the log-sum-exp merge of
// normalised partials both reproduce the one-call result (to fp32 rounding), including rows
// that see no key of a block.
TEST(AttnKernelContract, BlockwiseAccumulateAndMergeMatchOneCall) {
  Device dev;
  const int hq = 4, hk = 2, d = 32;
  const int64_t s = 600, split = 250;
  Tensor q(dev.mem(), Tag::kQkv, DType::kF32, s, hq * d),
      k(dev.mem(), Tag::kQkv, DType::kF32, s, hk * d),
      v(dev.mem(), Tag::kQkv, DType::kF32, s, hk * d);
  test::fill_normal(q, 1);
  test::fill_normal(k, 2);
  test::fill_normal(v, 3);
  Tensor o(dev.mem(), Tag::kAttnOut, DType::kF32, s, hq * d),
      lse(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s);
  attention_forward(dev, {q, k, v, hq, hk, d}, o, lse);

  const Mat k1 = k.mat().rows_of(0, split), v1 = v.mat().rows_of(0, split);
  const Mat k2 = k.mat().rows_of(split, s - split), v2 = v.mat().rows_of(split, s - split);
  // Online accumulation, second block first (order must not matter beyond rounding).
  Tensor acc(dev.mem(), Tag::kAttnOut, DType::kF32, s, hq * d),
      m(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s),
      l(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s);
  attention_accumulate_init(dev, acc, m, l);
  attention_forward_accumulate(dev, {q, k2, v2, hq, hk, d, 0, split}, acc, m, l);
  attention_forward_accumulate(dev, {q, k1, v1, hq, hk, d, 0, 0}, acc, m, l);
  Tensor oa(dev.mem(), Tag::kAttnOut, DType::kF32, s, hq * d),
      la(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s);
  attention_finalize(dev, acc, m, l, d, oa, la);
  // Merge of normalised partials.
  Tensor ob(dev.mem(), Tag::kAttnOut, DType::kF32, s, hq * d),
      lb(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s);
  Tensor ob2(dev.mem(), Tag::kAttnOut, DType::kF32, s, hq * d),
      lb2(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s);
  attention_forward(dev, {q, k1, v1, hq, hk, d, 0, 0}, ob, lb);
  attention_forward(dev, {q, k2, v2, hq, hk, d, 0, split}, ob2, lb2);
  lse_merge(dev, ob, lb, ob2, lb2, d);

  const double tol = 8 * std::numeric_limits<float>::epsilon() * test::max_abs(read(o));
  EXPECT_LE(test::max_abs_diff(read(oa), read(o)), tol);
  EXPECT_LE(test::max_abs_diff(read(ob), read(o)), tol);
  EXPECT_LE(test::max_abs_diff(read(la), read(lse)),
            8 * std::numeric_limits<float>::epsilon() * test::max_abs(read(lse)));
  EXPECT_LE(test::max_abs_diff(read(lb), read(lse)),
            8 * std::numeric_limits<float>::epsilon() * test::max_abs(read(lse)));
}

// Central finite differences of L = sum(do * o) in fp64 math through the reference forward,
// against the fast backward: checks the gradient formulas themselves, not just agreement of
// two implementations.
TEST(AttnKernelContract, GradientsMatchFiniteDifferences) {
  Device dev;
  const int hq = 2, hk = 1, d = 8;
  const int64_t s = 40;
  Case c{s, s, hq, hk, d, 0, 0, true, DType::kF32};
  Tensor q, k, v, dout;
  Inputs in = make_inputs(c, dev, q, k, v, dout);
  Tensor o(dev.mem(), Tag::kAttnOut, DType::kF32, s, hq * d),
      lse(dev.mem(), Tag::kAttnOut, DType::kF32, hq, s);
  AttnProblem p{q, k, v, hq, hk, d};
  attention_forward(dev, p, o, lse);
  Tensor delta(dev.mem(), Tag::kAttnGrad, DType::kF32, hq, s);
  attention_delta(dev, o, dout, d, delta);
  Tensor dq(dev.mem(), Tag::kAttnGrad, DType::kF32, s, hq * d),
      dk(dev.mem(), Tag::kAttnGrad, DType::kF32, s, hk * d),
      dv(dev.mem(), Tag::kAttnGrad, DType::kF32, s, hk * d);
  test::fill_value(dq, 0);
  test::fill_value(dk, 0);
  test::fill_value(dv, 0);
  attention_backward(dev, p, dout, lse, delta, dq, dk, dv);

  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                  const std::vector<double>& vv) {
    std::vector<double> oo(size_t(s * hq * d)), ll(size_t(hq * s));
    ref::attention_forward<double>(in.dims, test::cview(qq, s, hq * d), test::cview(kk, s, hk * d),
                                   test::cview(vv, s, hk * d), test::view(oo, s, hq * d),
                                   test::view(ll, hq, s));
    double L = 0;
    for (size_t i = 0; i < oo.size(); ++i) L += oo[i] * in.dout[i];
    return L;
  };
  const double h = 1e-5;
  auto fd_check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* what) {
    for (size_t i = 0; i < x.size(); i += 7) {
      const double x0 = x[i];
      x[i] = x0 + h;
      const double lp = loss(in.q, in.k, in.v);
      x[i] = x0 - h;
      const double lm = loss(in.q, in.k, in.v);
      x[i] = x0;
      EXPECT_NEAR(grad[i], (lp - lm) / (2 * h), 2e-4) << what << "[" << i << "]";
    }
  };
  fd_check(in.q, read(dq), "dq");
  fd_check(in.k, read(dk), "dk");
  fd_check(in.v, read(dv), "dv");
}

TEST(AttnKernelContract, MetaDeviceCountsWorkspaceOnly) {
  Device dev({BackendKind::kMeta, int64_t(1) << 50, 0});
  const int64_t s = int64_t(1) << 20;
  Tensor q(dev.mem(), Tag::kQkv, DType::kBF16, s, 32 * 128),
      k(dev.mem(), Tag::kQkv, DType::kBF16, s, 8 * 128),
      v(dev.mem(), Tag::kQkv, DType::kBF16, s, 8 * 128);
  Tensor o(dev.mem(), Tag::kAttnOut, DType::kBF16, s, 32 * 128),
      lse(dev.mem(), Tag::kAttnOut, DType::kF32, 32, s);
  const int64_t before = dev.mem().current();
  dev.mem().reset_peak();
  attention_forward(dev, {q, k, v, 32, 8, 128}, o, lse);
  EXPECT_EQ(dev.mem().peak() - before,
            attention_fwd_workspace_bytes(dev.backend(), 32, 8, 128, DType::kBF16));
}

}  // namespace
}  // namespace upipe
