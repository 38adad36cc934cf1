// Packed documents under every strategy on this job's ranks (ctest runs it on 1, 2, 3, 4 and 8):
// each method on sequences of several documents against each document run alone through `local`
// (y, dx and every weight gradient within check.h's rule for documents), its measured
// attention-intermediate peak equal to its formula and its communication equal to its documented
// counts, for: documents of length 1, lengths not divisible by 2C, one document spanning every
// rank, many tiny documents, ranks holding only pieces of documents. Also: a single document is
// bitwise the plain sequence, and changing the tokens (x, dy rows) of one document changes
// nothing, bitwise, in the other documents' rows of y and dx.
#include <fmt/format.h>

#include <numeric>
#include <ostream>

#include "attention/check.h"
#include "attention/harness.h"
#include "attention/methods.h"
#include "backend/tensor_ops.h"
#include "common/test_util.h"
#include "multirank/mpi_test_main.h"

namespace upipe {
namespace {

using test::world;

constexpr int64_t kSeq = 240;  // divisible by 2C and by N C for every C and N below

// The attention shape on C ranks: two UPipe stages of C heads, GQA, K < C on 8 ranks.
AttentionConfig shape(int c) {
  AttentionConfig cfg;
  cfg.seq_len = kSeq;
  cfg.heads = c == 1 ? 4 : 2 * c;
  cfg.kv_heads = c == 8 ? 4 : cfg.heads / 2;
  cfg.head_dim = 16;
  return cfg;
}

struct Method {
  MethodKnobs knobs;
  std::string name;
};

// Every method the rules admit on C ranks with shape(C): U = C, N = 4 (3 on 8 ranks, S / (N C)
// whole), u = the largest proper divisor of C (1 when C is prime); upipe and upipe-fpdt also
// with stage overlap.
std::vector<Method> methods_on(int c) {
  const int n = c == 8 ? 3 : 4;
  int deg = 1;
  for (int u = 2; u < c; ++u)
    if (c % u == 0) deg = u;
  std::vector<Method> out;
  auto add = [&](const std::string& m, int u, int ud, int chunks, bool overlap = false) {
    std::string name = m + (u ? fmt::format("_U{}", u) : "") + (ud ? fmt::format("_u{}", ud) : "") +
                       (chunks ? fmt::format("_N{}", chunks) : "") + (overlap ? "_overlap" : "");
    std::replace(name.begin(), name.end(), '-', '_');
    out.push_back({{m, u, ud, chunks, overlap}, name});
  };
  if (c == 1) add("local", 0, 0, 0);
  add("ulysses", 0, 0, 0);
  add("upipe", c, 0, 0);
  add("ring", 0, 0, 0);
  add("fpdt", 0, 0, n);
  add("upipe-fpdt", c, 0, n);
  add("upipe", c, 0, 0, true);
  add("upipe-fpdt", c, 0, n, true);
  if (deg > 1) add("usp", 0, deg, 0);
  if (c > 1) add("upipe-ring", deg, deg, 0);
  return out;
}

struct DocCase {
  std::string name;
  std::vector<int64_t> lens;
};

std::vector<DocCase> doc_cases() {
  std::vector<int64_t> tiny;  // lengths 1..7 repeating, the rest in one
  for (int64_t i = 0, left = kSeq; left > 0; ++i) {
    tiny.push_back(std::min<int64_t>(left, i % 7 + 1));
    left -= tiny.back();
  }
  return {{"length_one", {1, 37, 1, 1, 100, 1, 99}},
          {"odd_lengths", {7, 53, 61, 119}},
          {"spans_every_rank", {3, 230, 7}},
          {"many_tiny", tiny},
          {"only_pieces", {97, 143}}};
}

struct Case {
  Method method;
  DocCase docs;
  bool qk_norm = false;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const Method& m : methods_on(world().size()))
    for (const DocCase& d : doc_cases()) out.push_back({m, d, d.name == "odd_lengths"});
  return out;
}

// gtest prints a case by its name.
void PrintTo(const Method& m, std::ostream* os) {
  *os << m.name;
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.method.name << "_" << c.docs.name;
}

AttentionConfig config_of(const Case& c) {
  AttentionConfig cfg = shape(world().size());
  cfg.knobs = c.method.knobs;
  cfg.qk_norm = c.qk_norm;
  return cfg;
}

class Documents_ : public ::testing::TestWithParam<Case> {};

TEST_P(Documents_, MatchEachDocumentAloneWithExactMemoryAndCommunication) {
  const Case& c = GetParam();
  CheckOptions opt;
  opt.doc_lens = c.docs.lens;
  const CheckResult r = check_strategy(config_of(c), world(), opt);
  EXPECT_TRUE(r.passed) << r.rule;
  for (const auto& [k, v] : r.max_abs_err)
    EXPECT_LE(v, r.tolerance.at(k)) << k << " on " << world().size() << " ranks";
  EXPECT_EQ(r.attn_peak_bytes, r.attn_formula_bytes);
  ASSERT_TRUE(r.comm_expected.has_value());
  for (int op = 0; op < kNumCommOps; ++op) {
    if (CommOp(op) == CommOp::kAllGather || CommOp(op) == CommOp::kBroadcast) continue;
    EXPECT_EQ(r.comm.calls[size_t(op)], r.comm_expected->calls[size_t(op)])
        << comm_op_name(CommOp(op));
    EXPECT_EQ(r.comm.bytes_sent[size_t(op)], r.comm_expected->bytes_sent[size_t(op)])
        << comm_op_name(CommOp(op));
  }
}

INSTANTIATE_TEST_SUITE_P(Table, Documents_, ::testing::ValuesIn(cases()), [](const auto& i) {
  return i.param.method.name + "_" + i.param.docs.name;
});

// This rank's y, dx and weight gradients after one forward + backward of method m with the
// documents `lens` (empty: none set), the x and dy rows of document `changed` (-1: none)
// replaced by other values.
struct Outputs {
  std::vector<float> y, dx, g;
  RowPositions rows;
};

Outputs run_method(const Method& m, const std::vector<int64_t>& lens, int changed) {
  AttentionConfig cfg = shape(world().size());
  cfg.knobs = m.knobs;
  Device dev;
  auto strat = make_strategy({dev, world(), cfg});
  if (!lens.empty()) strat->set_documents(std::make_shared<const Documents>(lens, kSeq));
  Outputs out;
  out.rows = strat->layout().positions(world().rank());
  BlockTensors t = make_block_tensors(dev, cfg, out.rows, 1);
  if (changed >= 0) {
    const int64_t a = std::accumulate(lens.begin(), lens.begin() + changed, int64_t(0));
    const int64_t b = a + lens[size_t(changed)];
    for (Tensor* x : {&t.x, &t.dy}) {
      std::vector<float> v = download(dev, *x);
      const std::vector<int64_t> g = out.rows.expand();
      for (size_t r = 0; r < g.size(); ++r)
        if (g[r] >= a && g[r] < b)
          for (int64_t col = 0; col < x->cols(); ++col)
            v[r * size_t(x->cols()) + size_t(col)] = float(std::sin(double(r * 31 + col)));
      upload(dev, v.data(), *x);
    }
  }
  run_block(*strat, dev, t);
  out.y = download(dev, t.y);
  out.dx = download(dev, t.dx);
  for (const Tensor* g : {&t.gq, &t.gk, &t.gv, &t.go}) {
    const std::vector<float> v = download(dev, *g);
    out.g.insert(out.g.end(), v.begin(), v.end());
  }
  return out;
}

class DocumentBits : public ::testing::TestWithParam<Method> {};

// One document is the plain causal sequence: every output bitwise the same.
TEST_P(DocumentBits, OneDocumentIsBitwiseThePlainSequence) {
  const Outputs plain = run_method(GetParam(), {}, -1);
  const Outputs one = run_method(GetParam(), {kSeq}, -1);
  EXPECT_EQ(one.rows.expand(), plain.rows.expand());
  EXPECT_EQ(one.y, plain.y);
  EXPECT_EQ(one.dx, plain.dx);
  EXPECT_EQ(one.g, plain.g);
}

// Changing one document's tokens leaves every other document's rows of y and dx bitwise alone
// (and changes its own).
TEST_P(DocumentBits, OtherDocumentsAreBitwiseUnchanged) {
  const std::vector<int64_t> lens = {7, 53, 61, 119};
  const int changed = 2;  // rows [60, 121)
  const Outputs before = run_method(GetParam(), lens, -1);
  const Outputs after = run_method(GetParam(), lens, changed);
  const std::vector<int64_t> g = before.rows.expand();
  const size_t cols = before.y.size() / g.size();
  int64_t differ = 0;
  for (size_t r = 0; r < g.size(); ++r)
    for (size_t col = 0; col < cols; ++col) {
      const size_t at = r * cols + col;
      if (g[r] >= 60 && g[r] < 121) {
        differ += before.y[at] != after.y[at];
        continue;
      }
      ASSERT_EQ(before.y[at], after.y[at]) << "y row " << g[r];
      ASSERT_EQ(before.dx[at], after.dx[at]) << "dx row " << g[r];
    }
  float all = float(differ);
  world().all_reduce(&all, 1, DType::kF32, ReduceOp::kSum);
  EXPECT_GT(all, 0) << "the changed document's own rows must change";
}

INSTANTIATE_TEST_SUITE_P(Methods, DocumentBits, ::testing::ValuesIn(methods_on(world().size())),
                         [](const auto& i) { return i.param.name; });

}  // namespace
}  // namespace upipe
