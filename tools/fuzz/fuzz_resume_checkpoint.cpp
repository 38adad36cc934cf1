// libFuzzer harness: a training checkpoint as --resume loads it into ZeRO-3 (load_checkpoint, the
// run's model that of the seeds: fuzz_checkpoint_writer.h's small_model(16)), in one process: the
// run resumed on one rank, then the last rank of 3 (its shard resharded from the writer's ranks,
// padded past the model), each played alone by the fake communicator (load_checkpoint calls no
// collective). The input is fuzz_checkpoint_files' bundle (fuzz_checkpoint_bundle.h: meta.json and
// the rank files as records, every checksum recomputed), laid out as checkpoint.dir/step_N, N
// meta.json's step. Contract: a ConfigError of one line, or the state loaded: every shard of the
// layout's size, exactly the values the rank files hold at those elements of their units (read
// back here from the files' own headers), zero in the padding, finite, the second moments not
// negative. Seeds: fuzz_checkpoint_files' (the real writer on 1, 2 and 3 ranks; tools/fuzz/seeds.py
// copies them here).
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "backend/tensor_ops.h"
#include "comm/fake/fake_comm.h"
#include "fuzz_checkpoint_bundle.h"

using namespace upipe;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kFields[] = {"master", "exp_avg", "exp_avg_sq"};

// The loading ranks: (rank, world).
constexpr std::pair<int, int> kLoaders[] = {{0, 1}, {2, 3}};

// "step_N" for the step DONE names (as the writer names it), "step_00000000" for none.
std::string step_dir(const std::string& step) {
  int64_t s = 0;
  const auto r = std::from_chars(step.data(), step.data() + step.size(), s);
  if (r.ec != std::errc() || r.ptr != step.data() + step.size() || s < 0) s = 0;
  return fmt::format("step_{:08d}", s);
}

// What a loaded checkpoint's files hold, read here without the library: element e of unit u's
// `field` is element e - q * shard_u of tensor unit<u>.<field> in rank file q = e / shard_u.
class Written {
 public:
  Written(const fs::path& ckpt, size_t files) {
    const json meta = json::parse(fuzz::slurp(ckpt / "meta.json"));
    for (const json& u : meta.at("units")) shard_.push_back(u.at("shard").get<int64_t>());
    for (size_t q = 0; q < files; ++q) {
      bytes_.push_back(fuzz::slurp(ckpt / fmt::format("rank_{:05d}.safetensors", q)));
      uint64_t n = 0;
      fuzz::require(bytes_.back().size() >= 8, "loaded, but a rank file has no header length");
      std::memcpy(&n, bytes_.back().data(), 8);
      fuzz::require(n <= bytes_.back().size() - 8, "loaded, but a header exceeds its file");
      data_.push_back(8 + n);
      head_.push_back(json::parse(std::string_view(bytes_.back()).substr(8, n)));
    }
  }
  size_t units() const { return shard_.size(); }

  // The bits of element e of unit u's field.
  uint32_t at(int u, int field, int64_t e) const {
    const int64_t shard = shard_[size_t(u)];
    const size_t q = size_t(e / shard);
    fuzz::require(q < bytes_.size(), "loaded an element past the rank files");
    const json& t = head_[q].at(fmt::format("unit{}.{}", u, kFields[field]));
    const uint64_t first = t.at("data_offsets").at(0).get<uint64_t>();
    const uint64_t at = data_[q] + first + uint64_t(e - int64_t(q) * shard) * 4;
    fuzz::require(at <= bytes_[q].size() && bytes_[q].size() - at >= 4,
                  "loaded an element past its rank file");
    uint32_t bits = 0;
    std::memcpy(&bits, bytes_[q].data() + at, 4);
    return bits;
  }

 private:
  std::vector<int64_t> shard_;      // per unit, as written
  std::vector<std::string> bytes_;  // per rank file
  std::vector<uint64_t> data_;      // per rank file: where its data starts
  std::vector<json> head_;          // per rank file: its header
};

// The contract on a loaded rank's state.
void check_loaded(Zero3& z, const Written& w) {
  fuzz::require(size_t(z.num_units()) == w.units(), "loaded a checkpoint of other units");
  for (int u = 0; u < z.num_units(); ++u) {
    const ZeroUnitLayout& l = z.layout(u);
    const int64_t lo = z.shard_first(u);
    for (int field = 0; field < 3; ++field) {
      const Mat m = field == 0 ? z.master(u) : field == 1 ? z.exp_avg(u) : z.exp_avg_sq(u);
      fuzz::require(m.rows == 1 && m.cols == l.shard, "a shard of another size than the layout's");
      const std::vector<float> got = download(z.device(), m);
      for (int64_t i = 0; i < l.shard; ++i) {
        const float v = got[size_t(i)];
        uint32_t bits = 0;
        std::memcpy(&bits, &v, 4);
        if (lo + i >= l.numel) {
          fuzz::require(bits == 0, "padding past the model is not zero");
          continue;
        }
        fuzz::require(bits == w.at(u, field, lo + i), "loaded a value the rank files do not hold");
        fuzz::require(std::isfinite(v), "loaded a value that is not finite");
        fuzz::require(field != 2 || v >= 0, "loaded a negative second moment");
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> rec = fuzz::records(fuzz::as_text(data, size));
  if (rec.empty()) return 0;
  fs::remove_all(fuzz::scratch() / "resume");
  const std::string step = fuzz::write_bundle("resume/written", rec);
  const fs::path ckpt = fuzz::scratch() / "resume" / step_dir(step);
  fs::rename(fuzz::scratch() / "resume/written", ckpt);
  static Device dev;
  static const ModelConfig model = fuzz::small_model(16);
  for (const auto& [rank, world] : kLoaders) {
    FakeCommunicator comm(rank, world);
    Zero3 z(dev, comm, model, DType::kF32);
    fuzz::refused_or_read([&] {
      const CheckpointInfo info = load_checkpoint(ckpt.string(), z);
      fuzz::require(std::to_string(info.step) == step, "loaded another step than DONE's");
      check_loaded(z, Written(ckpt, size_t(info.world)));
    });
  }
  return 0;
}
