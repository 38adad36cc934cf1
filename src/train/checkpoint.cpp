#include "train/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/tensor_ops.h"
#include "core/errors.h"
#include "model/safetensors.h"

namespace upipe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "upipe-zero3-checkpoint-1";
const char* const kFields[] = {"master", "exp_avg", "exp_avg_sq"};

std::string step_dir_name(int64_t step) {
  return fmt::format("step_{:08d}", step);
}
std::string rank_file(int rank) {
  return fmt::format("rank_{:05d}.safetensors", rank);
}
std::string tensor_key(int unit, int field) {
  return fmt::format("unit{}.{}", unit, kFields[field]);
}

void fsync_path(const fs::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw Error(fmt::format("cannot open {} to sync it", p.string()));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error(fmt::format("fsync of {} failed", p.string()));
}

void write_synced(const fs::path& p, const std::string& text) {
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw Error(fmt::format("cannot write {}", p.string()));
  }
  fsync_path(p, false);
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw ConfigError(fmt::format("checkpoint file {} is missing", p.string()));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool complete(const fs::path& p) {
  return fs::is_directory(p) && fs::exists(p / "DONE") && fs::exists(p / "meta.json");
}

// The complete checkpoints under dir, oldest first.
std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> v;
  if (!fs::is_directory(dir)) return v;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.size() != 13 || n.rfind("step_", 0) != 0 || !complete(e.path())) continue;
    if (n.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    v.emplace_back(std::stoll(n.substr(5)), e.path());
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Per unit: element count and the shard size the writer used.
struct SavedUnit {
  int64_t numel = 0, shard = 0;
};

struct Saved {
  CheckpointInfo info;
  std::vector<SavedUnit> units;
};

Saved read_saved(const std::string& path) {
  const fs::path p(path);
  if (!fs::is_directory(p))
    throw ConfigError(fmt::format("checkpoint {} is not a directory", path));
  if (!fs::exists(p / "DONE"))
    throw ConfigError(
        fmt::format("checkpoint {} is incomplete (no DONE marker): it was being "
                    "written when the run stopped; use an older one",
                    path));
  const std::string meta = (p / "meta.json").string();
  Saved s;
  try {
    const json j = json::parse(read_text(meta));
    if (j.at("format").get<std::string>() != kFormat)
      throw ConfigError(
          fmt::format("{}: format {} is not {}", meta, j.at("format").dump(), kFormat));
    s.info.path = path;
    s.info.step = j.at("step").get<int64_t>();
    s.info.world = j.at("world").get<int>();
    s.info.cp_size = j.at("cp_size").get<int>();
    s.info.model_json = j.at("model").get<std::string>();
    s.info.run_toml = j.at("run").get<std::string>();
    for (const json& u : j.at("units")) s.units.push_back({u.at("numel"), u.at("shard")});
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: malformed checkpoint metadata: {}", meta, e.what()));
  }
  if (s.info.world < 1 || s.info.step < 0)
    throw ConfigError(
        fmt::format("{}: world {} / step {} are invalid", meta, s.info.world, s.info.step));
  return s;
}

// Reads elements [a, b) of unit u's flat `field` from the writer's shards.
void read_flat(const std::vector<SafetensorsReader>& files, const SavedUnit& su, int unit,
               int field, int64_t a, int64_t b, float* dst) {
  for (int q = 0; q < int(files.size()) && a < b; ++q) {
    const int64_t qa = int64_t(q) * su.shard, qb = qa + su.shard;
    const int64_t x = std::max(a, qa), y = std::min(b, qb);
    if (x >= y) continue;
    files[size_t(q)].read_range(tensor_key(unit, field), x - qa, y - x, DType::kF32, dst + (x - a));
  }
}

std::vector<SafetensorsReader> open_rank_files(const Saved& s) {
  std::vector<SafetensorsReader> files;
  for (int q = 0; q < s.info.world; ++q) {
    const fs::path f = fs::path(s.info.path) / rank_file(q);
    if (!fs::exists(f)) throw ConfigError(fmt::format("checkpoint file {} is missing", f.string()));
    files.emplace_back(f.string());
    for (size_t u = 0; u < s.units.size(); ++u)
      for (int field = 0; field < 3; ++field) {
        const SafetensorsTensor& t = files.back().tensor(tensor_key(int(u), field));
        if (t.shape != std::vector<int64_t>{s.units[u].shard})
          throw ConfigError(fmt::format("{}: tensor {} has {} elements, meta.json says {}",
                                        f.string(), tensor_key(int(u), field),
                                        t.shape.empty() ? 0 : t.shape[0], s.units[u].shard));
      }
  }
  return files;
}

void check_model(const Saved& s, const std::vector<ZeroUnitLayout>& layout, const ModelConfig& m) {
  if (s.units.size() != layout.size())
    throw ConfigError(
        fmt::format("checkpoint {} has {} parameter units, this model ({}) has {}: it "
                    "was written for another model",
                    s.info.path, s.units.size(), m.source, layout.size()));
  for (size_t u = 0; u < layout.size(); ++u)
    if (s.units[u].numel != layout[u].numel)
      throw ConfigError(fmt::format(
          "checkpoint {}: {} has {} parameters, this model ({}) has {}: it was written for another "
          "model",
          s.info.path, unit_name(m, int(u)), s.units[u].numel, m.source, layout[u].numel));
}

}  // namespace

std::string save_checkpoint(const std::string& dir, int64_t step, Zero3& z, int cp_size,
                            const std::string& run_toml, int keep) {
  Communicator& world = z.world();
  const fs::path final_dir = fs::path(dir) / step_dir_name(step);
  const fs::path tmp = fs::path(dir) / (step_dir_name(step) + ".tmp");
  if (world.rank() == 0) {
    fs::create_directories(dir);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  world.barrier();
  // Every rank: its shards, written atomically and fsynced by write_safetensors.
  // Streamed from the device piece by piece (the writer's one staging buffer): no host copy of
  // the shards.
  Device& dev = z.device();
  std::vector<SafetensorsWriteItem> items;
  for (int u = 0; u < z.num_units(); ++u)
    for (int field = 0; field < 3; ++field) {
      const Mat m = field == 0 ? z.master(u) : field == 1 ? z.exp_avg(u) : z.exp_avg_sq(u);
      items.push_back({tensor_key(u, field),
                       DType::kF32,
                       {m.cols},
                       nullptr,
                       [&dev, m](int64_t first, int64_t count, void* dst) {
                         dev.copy(dst, m.at(0, first), mat_bytes(1, count, DType::kF32),
                                  CopyKind::kDeviceToHost);
                       }});
    }
  write_safetensors((tmp / rank_file(world.rank())).string(), items,
                    {{"rank", std::to_string(world.rank())},
                     {"world", std::to_string(world.size())},
                     {"step", std::to_string(step)}});
  world.barrier();
  if (world.rank() == 0) {
    json units = json::array();
    for (int u = 0; u < z.num_units(); ++u)
      units.push_back({{"name", unit_name(z.model(), u)},
                       {"numel", z.layout(u).numel},
                       {"shard", z.layout(u).shard}});
    const json meta = {{"format", kFormat},     {"step", step},
                       {"world", world.size()}, {"cp_size", cp_size},
                       {"units", units},        {"model", model_config_json(z.model(), "float32")},
                       {"run", run_toml}};
    write_synced(tmp / "meta.json", meta.dump(2) + "\n");
    fsync_path(tmp, true);
    fs::remove_all(final_dir);
    fs::rename(tmp, final_dir);
    write_synced(final_dir / "DONE", fmt::format("{}\n", step));
    fsync_path(final_dir, true);
    fsync_path(fs::path(dir), true);
    // Prune: the newest `keep` complete checkpoints stay; stale temporaries go.
    const auto all = complete_checkpoints(dir);
    if (keep > 0)
      for (size_t i = 0; i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i].second);
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (n.size() > 4 && n.substr(n.size() - 4) == ".tmp" && n.rfind("step_", 0) == 0)
        fs::remove_all(e.path());
    }
  }
  world.barrier();
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  const auto all = complete_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  return read_saved(path).info;
}

CheckpointInfo load_checkpoint(const std::string& path, Zero3& z) {
  const Saved s = read_saved(path);
  check_model(s, zero_layout(z.model(), 1), z.model());
  const std::vector<SafetensorsReader> files = open_rank_files(s);
  Device& dev = z.device();
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<float> host;
  for (int u = 0; u < z.num_units(); ++u) {
    const ZeroUnitLayout& l = z.layout(u);
    const int64_t lo = z.shard_first(u), hi = std::min(lo + l.shard, l.numel);
    for (int field = 0; field < 3; ++field) {
      const Mat dst = field == 0 ? z.master(u) : field == 1 ? z.exp_avg(u) : z.exp_avg_sq(u);
      zero(dev, dst);  // the padding
      if (!dev.backend().computes()) continue;
      for (int64_t c = lo; c < hi; c += kChunk) {
        const int64_t n = std::min(kChunk, hi - c);
        host.resize(size_t(n));
        read_flat(files, s.units[size_t(u)], u, field, c, c + n, host.data());
        upload(dev, host.data(), dst.block(0, 1, c - lo, n));
      }
    }
  }
  return s.info;
}

struct CheckpointReader::Impl {
  Saved saved;
  std::vector<SafetensorsReader> files;
  std::vector<ZeroUnitLayout> layout;
};

CheckpointReader::CheckpointReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->saved = read_saved(path);
  info_ = impl_->saved.info;
  m_ = parse_model_config(info_.model_json, path + "/meta.json (model)");
  impl_->layout = zero_layout(m_, 1);
  check_model(impl_->saved, impl_->layout, m_);
  impl_->files = open_rank_files(impl_->saved);
}

CheckpointReader::~CheckpointReader() = default;

std::pair<size_t, size_t> CheckpointReader::locate(int tensor_index) const {
  for (size_t u = 0; u < impl_->layout.size(); ++u) {
    const ZeroUnitLayout& l = impl_->layout[u];
    for (size_t i = 0; i < l.tensors.size(); ++i)
      if (l.index[i] == tensor_index) return {u, i};
  }
  throw Error(fmt::format("tensor index {} is not in the model", tensor_index));
}

void CheckpointReader::read(int tensor_index, float* dst) const {
  const auto [u, i] = locate(tensor_index);
  read_range(tensor_index, 0, impl_->layout[u].tensors[i].numel(), dst);
}

void CheckpointReader::read_range(int tensor_index, int64_t first, int64_t count,
                                  float* dst) const {
  const auto [u, i] = locate(tensor_index);
  const ZeroUnitLayout& l = impl_->layout[u];
  const int64_t numel = l.tensors[i].numel();
  UPIPE_CHECK(first >= 0 && count >= 0 && first <= numel && count <= numel - first,
              "elements [{}, {} + {}) of {}, which has {}", first, first, count, l.tensors[i].name,
              numel);
  const int64_t a = l.offsets[i] + first;
  read_flat(impl_->files, impl_->saved.units[u], int(u), 0, a, a + count, dst);
}

}  // namespace upipe
