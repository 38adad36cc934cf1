#include "train/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "backend/tensor_ops.h"
#include "core/build_info.h"
#include "core/check.h"
#include "core/checked.h"
#include "core/errors.h"
#include "core/fault_inject.h"
#include "core/safe_fs.h"
#include "core/setting_ref.h"
#include "core/strict_json.h"
#include "core/watchdog.h"
#include "model/safetensors.h"

namespace upipe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "upipe-zero3-checkpoint-2";
constexpr const char* kChecksum = "xxh3-64";
constexpr const char* kLockFile = ".upipe-lock";  // in checkpoint.dir: who writes there now
const char* const kFields[] = {"master", "exp_avg", "exp_avg_sq"};
constexpr int kNumFields = 3;
// Bounds on what is read from a checkpoint directory before parsing it.
constexpr int64_t kMaxMetaBytes = int64_t(256) << 20;
constexpr int64_t kMaxSmallFileBytes = 4096;  // DONE, the run-id marker
// What to do about a corrupt checkpoint: --resume takes the newest, so the older one is reached
// by moving this one away.
constexpr const char* kOlderCheckpoint =
    "use an older one (to resume from the one before, move this one out of its directory: "
    "--resume takes the newest complete checkpoint)";

std::string step_dir_name(int64_t step) {
  return fmt::format("step_{:08d}", step);
}
std::string rank_file(int rank) {
  return fmt::format("rank_{:05d}.safetensors", rank);
}
std::string tensor_key(int unit, int field) {
  return fmt::format("unit{}.{}", unit, kFields[field]);
}
std::string hex64(uint64_t h) {
  return fmt::format("{:016x}", h);
}
uint64_t xxh3(const void* p, int64_t bytes) {
  return XXH3_64bits(p, size_t(bytes));
}

// ---- The directory: which step directories exist and whose they are ----

// One step_<digits> or step_<digits>.tmp entry of a checkpoint directory.
struct Entry {
  int64_t step = 0;
  fs::path path;
  bool tmp = false;       // being written (or left by a crash while being written)
  bool complete = false;  // renamed, with DONE
  std::string run_id;     // "" when it cannot be read
};

// "step_<1 to 18 digits>[.tmp]" -> the step; false for any other name.
bool parse_step_name(const std::string& n, int64_t* step, bool* tmp) {
  if (n.rfind("step_", 0) != 0) return false;
  *tmp = n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0;
  const size_t b = 5, e = n.size() - (*tmp ? 4 : 0);
  if (e <= b || e - b > 18) return false;
  const auto r = std::from_chars(n.data() + b, n.data() + e, *step);
  return r.ec == std::errc() && r.ptr == n.data() + e;
}

// What new_run_id writes (32 hex digits), or any id of up to 64 letters, digits, '-' and '_': a
// file's longer or other text is no run id (quoted in messages, it could fill them).
bool is_run_id(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (const char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  return true;
}

std::string read_run_id(const fs::path& entry, bool tmp) {
  try {
    std::string s;
    if (tmp) {
      s = read_small_file((entry / "run_id").string(), "run id", kMaxSmallFileBytes);
      while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    } else {
      const std::string meta = (entry / "meta.json").string();
      const json j =
          parse_json_strict(read_small_file(meta, "checkpoint metadata", kMaxMetaBytes), meta);
      s = j.at("run_id").get<std::string>();
    }
    return is_run_id(s) ? s : "";  // not a run id: unreadable
  } catch (const std::exception&) {
    return "";
  }
}

// Every step entry under dir, by step (temporaries after the directory of the same step).
std::vector<Entry> list_entries(const fs::path& dir) {
  std::vector<Entry> v;
  std::error_code ec, ignored;  // ec: the listing's; ignored: each entry's own checks
  if (!fs::is_directory(dir, ignored)) return v;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    Entry x;
    if (!parse_step_name(e.path().filename().string(), &x.step, &x.tmp)) continue;
    if (!e.is_directory(ignored) || e.is_symlink(ignored)) continue;
    x.path = e.path();
    x.complete = !x.tmp && fs::is_regular_file(x.path / "DONE", ignored) &&
                 fs::is_regular_file(x.path / "meta.json", ignored);
    x.run_id = read_run_id(x.path, x.tmp);
    v.push_back(std::move(x));
  }
  if (ec) throw ConfigError(fmt::format("cannot list {}: {}", dir.string(), ec.message()));
  std::sort(v.begin(), v.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.step, a.tmp) < std::tie(b.step, b.tmp);
  });
  return v;
}

}  // namespace

bool is_step_dir_name(const std::string& name) {
  int64_t step = 0;
  bool tmp = false;
  return parse_step_name(name, &step, &tmp);
}

// A step_N entry of dir that is a symbolic link or no directory (list_entries skips them): refused
// where checkpoints are looked for. Skipped, a linked newest checkpoint left resume and export on
// an older one without a word (and a run reaching that step failed there, after its compute).
void refuse_odd_step_entries(const std::string& dir) {
  std::error_code ec, ignored;
  if (!fs::is_directory(dir, ignored)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int64_t step = 0;
    bool tmp = false;
    if (!parse_step_name(e.path().filename().string(), &step, &tmp)) continue;
    if (e.is_symlink(ignored))
      throw ConfigError(fmt::format(
          "{} is a symbolic link (to {}): checkpoints are read and written only as directories "
          "of checkpoint.dir (a run prunes and replaces its step directories there); move the "
          "directory itself there (export also takes a checkpoint by its own path)",
          e.path().string(), fs::read_symlink(e.path(), ignored).string()));
    if (!e.is_directory(ignored))
      throw ConfigError(fmt::format(
          "{} is named as a checkpoint but is not a directory, which no run replaces: move it "
          "out of checkpoint.dir",
          e.path().string()));
  }
}

namespace {

std::string new_run_id(Communicator& world) {
  char id[33] = {};
  if (world.rank() == 0) {
    std::random_device rd;
    const std::string s = fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
    std::copy(s.begin(), s.end(), id);
  }
  world.broadcast(id, 32, 0);
  return std::string(id, 32);
}

// ---- Reading: meta.json, verified against DONE, and the rank files, verified against it ----

struct SavedUnit {
  int64_t numel = 0, shard = 0;
};

struct SavedFile {
  int64_t bytes = 0;
  uint64_t header = 0;          // XXH3-64 of the 8-byte length and the JSON header
  std::vector<uint64_t> piece;  // per tensor in (unit, field) order, per piece
};

struct Saved {
  CheckpointInfo info;
  std::vector<SavedUnit> units;
  std::vector<SavedFile> files;  // per writer rank
  int64_t piece = kCheckpointPiece;
  std::vector<int64_t> piece_base;  // per tensor (unit * 3 + field): its first piece's index
};

uint64_t parse_hex64(const json& v, const std::string& meta) {
  const std::string s = v.get<std::string>();
  uint64_t h = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), h, 16);
  if (s.size() != 16 || r.ec != std::errc() || r.ptr != s.data() + s.size())
    throw ConfigError(
        fmt::format("{}: '{}' is not a 16-digit hexadecimal checksum", meta, excerpt(s)));
  return h;
}

// The text of meta.json, checked against the checksum DONE holds; DONE's text in *done_text.
std::string verified_meta_text(const fs::path& p, std::string* done_text = nullptr) {
  const std::string done_path = (p / "DONE").string(), meta = (p / "meta.json").string();
  const std::string done = read_small_file(done_path, "checkpoint marker", kMaxSmallFileBytes);
  if (done_text) *done_text = done;
  const std::string text = read_small_file(meta, "checkpoint metadata", kMaxMetaBytes);
  const std::string want =
      fmt::format("meta.json {} {}\n", kChecksum, hex64(xxh3(text.data(), int64_t(text.size()))));
  if (done.find(want) == std::string::npos)
    throw ConfigError(fmt::format(
        "{} does not match the checksum in {}: the checkpoint is corrupt; {}", meta,
        done_path, kOlderCheckpoint));
  return text;
}

// An integer of meta.json in [lo, hi]: never narrowed (a world of 2^32 + 2 read as 2) nor a float
// truncated (a numel of 4.75).
int64_t meta_int(const json& v, const char* key, int64_t lo, int64_t hi, const std::string& meta) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) ||
      v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    throw ConfigError(
        fmt::format("{}: {} = {} is not an integer in [{}, {}]; the checkpoint is "
                    "corrupt",
                    meta, key, json_excerpt(v), lo, hi));
  return v.get<int64_t>();
}

void parse_meta(const json& j, const std::string& meta, Saved& s) {
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  constexpr int64_t kMaxI64 = std::numeric_limits<int64_t>::max();
  // A unit's elements (far beyond any model: 2^50 fp32 values are 4 PiB), so that the shard
  // arithmetic on them cannot overflow.
  constexpr int64_t kMaxUnitElements = int64_t(1) << 50;
  if (j.at("format").get<std::string>() != kFormat)
    throw ConfigError(
        fmt::format("{}: format {} is not {}", meta, json_excerpt(j.at("format")), kFormat));
  s.info.run_id = j.at("run_id").get<std::string>();
  if (!is_run_id(s.info.run_id))
    throw ConfigError(fmt::format(
        "{}: run_id {} is not a run id (up to 64 letters, digits, - and _); the checkpoint is "
        "corrupt",
        meta, json_excerpt(j.at("run_id"))));
  s.info.step = meta_int(j.at("step"), "step", 0, kMaxI64, meta);
  s.info.world = int(meta_int(j.at("world"), "world", 1, kMaxInt, meta));
  s.info.cp_size = int(meta_int(j.at("cp_size"), "cp_size", 1, kMaxInt, meta));
  s.info.model_json = j.at("model").get<std::string>();
  s.info.run_toml = j.at("run").get<std::string>();
  // Informational (older checkpoints lack it): never a reason to refuse the checkpoint.
  if (const auto w = j.find("upipe"); w != j.end() && w->is_string())
    s.info.written_by = w->get<std::string>();
  if (const auto d = j.find("data"); d != j.end() && d->is_string())
    s.info.data = d->get<std::string>();
  const json& c = j.at("checksum");
  if (c.at("algorithm").get<std::string>() != kChecksum)
    throw ConfigError(
        fmt::format("{}: checksum {} is not {}", meta, json_excerpt(c.at("algorithm")), kChecksum));
  s.piece = meta_int(c.at("piece_elements"), "piece_elements", 1, kMaxI64, meta);
  for (const json& u : j.at("units"))
    s.units.push_back({meta_int(u.at("numel"), "numel", 1, kMaxUnitElements, meta),
                       meta_int(u.at("shard"), "shard", 1, kMaxUnitElements, meta)});
  for (const json& f : j.at("files")) {
    SavedFile sf;
    sf.bytes = meta_int(f.at("bytes"), "bytes", 0, kMaxI64, meta);
    sf.header = parse_hex64(f.at("header_xxh3"), meta);
    for (const json& h : f.at("pieces_xxh3")) sf.piece.push_back(parse_hex64(h, meta));
    s.files.push_back(std::move(sf));
  }
}

// Every count in meta.json consistent with the others, in checked arithmetic.
void check_meta(const std::string& meta, Saved& s) {
  auto bad = [&](const std::string& what) {
    throw ConfigError(fmt::format("{}: {}; the checkpoint is corrupt", meta, what));
  };
  if (s.info.world < 1 || s.info.step < 0 || s.info.cp_size < 1 || s.info.world % s.info.cp_size)
    bad(fmt::format("world {}, cp_size {}, step {} are invalid", s.info.world, s.info.cp_size,
                    s.info.step));
  if (s.piece < 1 || s.piece > (int64_t(1) << 30))
    bad(fmt::format("piece_elements {} is out of range", s.piece));
  if (int64_t(s.files.size()) != s.info.world)
    bad(fmt::format("{} rank files listed for world {}", s.files.size(), s.info.world));
  int64_t pieces = 0;
  for (const SavedUnit& u : s.units) {
    if (u.numel < 1 || u.shard != (u.numel + s.info.world - 1) / s.info.world)
      bad(fmt::format("a unit of {} elements has shard {} over {} ranks", u.numel, u.shard,
                      s.info.world));
    for (int f = 0; f < kNumFields; ++f) {
      s.piece_base.push_back(pieces);
      pieces = checked_add(pieces, (u.shard + s.piece - 1) / s.piece, "checkpoint pieces");
    }
  }
  for (size_t q = 0; q < s.files.size(); ++q)
    if (int64_t(s.files[q].piece.size()) != pieces)
      bad(fmt::format("{} lists {} checksums, its tensors have {} pieces", rank_file(int(q)),
                      s.files[q].piece.size(), pieces));
}

Saved read_saved(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (!fs::is_directory(p, ec))
    throw ConfigError(fmt::format("checkpoint {} is not a directory", path));
  if (!fs::exists(p / "DONE", ec))
    throw ConfigError(
        fmt::format("checkpoint {} is incomplete (no DONE marker): it was being "
                    "written when the run stopped; use an older one",
                    path));
  const std::string meta = (p / "meta.json").string();
  Saved s;
  s.info.path = path;
  std::string done;
  const std::string text = verified_meta_text(p, &done);
  try {
    parse_meta(parse_json_strict(text, meta), meta, s);
  } catch (const json::exception& e) {
    throw ConfigError(
        fmt::format("{}: malformed checkpoint metadata: {}", meta, json_error_text(e)));
  }
  check_meta(meta, s);
  // The step its directory is named by and DONE's are meta.json's: a checkpoint renamed to a
  // later step would be resumed as the newest, every later resume going back to it.
  int64_t named = 0;
  bool tmp = false;
  if (parse_step_name(p.filename().string(), &named, &tmp) && !tmp && named != s.info.step)
    throw ConfigError(fmt::format(
        "checkpoint {} holds step {} (meta.json), not the step its name says ({}): it was renamed "
        "or is corrupt; give it back its name {} or remove it",
        path, s.info.step, named, step_dir_name(s.info.step)));
  if (!done.starts_with(fmt::format("step {}\n", s.info.step)))
    throw ConfigError(
        fmt::format("{}: does not say step {} as meta.json does; the checkpoint is "
                    "corrupt",
                    (p / "DONE").string(), s.info.step));
  return s;
}

// The rank files of a checkpoint, opened and checked against meta.json, read piece by piece with
// every piece verified (the last one kept, so sequential reads read each piece once).
class RankFiles {
 public:
  explicit RankFiles(Saved s) : s_(std::move(s)) {
    for (int q = 0; q < s_.info.world; ++q) open(q);
  }
  const Saved& saved() const { return s_; }

  // Elements [a, b) of unit u's flat `field` from the writers' shards.
  void read(int unit, int field, int64_t a, int64_t b, float* dst) {
    const int64_t shard = s_.units[size_t(unit)].shard;
    for (int q = 0; q < int(files_.size()) && a < b; ++q) {
      const int64_t qa = int64_t(q) * shard;
      const int64_t x = std::max(a, qa), y = std::min(b, qa + shard);
      for (int64_t e = x; e < y;) {  // e: element of the unit; e - qa: of q's shard
        const int64_t p = (e - qa) / s_.piece, p0 = qa + p * s_.piece;
        const float* src = piece(q, unit * kNumFields + field, p);
        const int64_t n = std::min(y, p0 + s_.piece) - e;
        std::copy(src + (e - p0), src + (e - p0) + n, dst + (e - a));
        e += n;
      }
    }
  }

 private:
  std::string file(int q) const { return (fs::path(s_.info.path) / rank_file(q)).string(); }

  void open(int q) {
    const std::string f = file(q);
    const SavedFile& sf = s_.files[size_t(q)];
    std::error_code ec;
    if (fs::symlink_status(f, ec).type() == fs::file_type::not_found)
      throw ConfigError(fmt::format(
          "checkpoint file {} is missing (meta.json lists a file for each of its {} ranks): the "
          "checkpoint is incomplete; {}",
          f, s_.info.world, kOlderCheckpoint));
    {
      const ReadFile rf(f, "checkpoint file");
      if (rf.size() != sf.bytes)
        throw ConfigError(
            fmt::format("checkpoint file {} has {} bytes, meta.json says {}: it is "
                        "truncated or was replaced",
                        f, rf.size(), sf.bytes));
      uint64_t n = 0;
      rf.read_at(&n, 8, 0);
      if (rf.size() < 8 || n > uint64_t(rf.size() - 8))
        throw ConfigError(
            fmt::format("checkpoint file {}: header length {} exceeds the file", f, n));
      std::string head(size_t(8 + n), '\0');
      rf.read_at(head.data(), int64_t(head.size()), 0);
      if (xxh3(head.data(), int64_t(head.size())) != sf.header)
        throw ConfigError(
            fmt::format("checkpoint file {}: its header does not match the checksum "
                        "in meta.json (the file is corrupt); {}",
                        f, kOlderCheckpoint));
    }
    files_.emplace_back(f);
    check_file_metadata(q);
    for (size_t u = 0; u < s_.units.size(); ++u)
      for (int field = 0; field < kNumFields; ++field) {
        const SafetensorsTensor& t = files_.back().tensor(tensor_key(int(u), field));
        if (t.dtype != "F32" || t.shape != std::vector<int64_t>{s_.units[u].shard})
          throw ConfigError(
              fmt::format("{}: tensor {} is {} with {} elements, meta.json says F32 "
                          "with {}",
                          f, t.name, t.dtype, t.numel, s_.units[u].shard));
      }
  }

  // The rank file names its rank, world, step and run: they must be the checkpoint's.
  void check_file_metadata(int q) const {
    const std::map<std::string, std::string>& md = files_[size_t(q)].metadata();
    const std::pair<const char*, std::string> want[] = {{"rank", std::to_string(q)},
                                                        {"world", std::to_string(s_.info.world)},
                                                        {"step", std::to_string(s_.info.step)},
                                                        {"run_id", s_.info.run_id}};
    for (const auto& [key, value] : want) {
      const auto it = md.find(key);
      if (it == md.end() || it->second != value)
        throw ConfigError(
            fmt::format("checkpoint file {}: its {} is {}, meta.json's is {}: the "
                        "file belongs to another checkpoint",
                        file(q), key, it == md.end() ? "missing" : it->second, value));
    }
  }

  const float* piece(int q, int tensor, int64_t p) {
    if (q == cached_[0] && tensor == cached_[1] && p == cached_[2]) return buf_.data();
    const int unit = tensor / kNumFields, field = tensor % kNumFields;
    const int64_t shard = s_.units[size_t(unit)].shard;
    const int64_t first = p * s_.piece, n = std::min(s_.piece, shard - first);
    buf_.resize(size_t(n));
    cached_ = {-1, -1, -1};
    files_[size_t(q)].read_range(tensor_key(unit, field), first, n, DType::kF32, buf_.data());
    const uint64_t want = s_.files[size_t(q)].piece[size_t(s_.piece_base[size_t(tensor)] + p)];
    if (xxh3(buf_.data(), n * 4) != want)
      throw ConfigError(fmt::format(
          "checkpoint file {}: tensor {} elements [{}, {}) do not match their checksum in "
          "meta.json (the file is corrupt); {}",
          file(q), tensor_key(unit, field), first, first + n, kOlderCheckpoint));
    check_values(q, unit, field, first);
    cached_ = {q, tensor, p};
    return buf_.data();
  }

  // buf_, elements [first, ...) of unit's field in file q, holds only values a run continues from:
  // every one finite and the second moments not negative (a step whose loss or gradient is not
  // finite ends the run before its update). A checksum vouches for bytes, not for this: a resumed
  // run would diverge at its first step on such a value, an export write it into the weights.
  void check_values(int q, int unit, int field, int64_t first) const {
    for (size_t i = 0; i < buf_.size(); ++i) {
      const float v = buf_[i];
      if (std::isfinite(v) && (field != 2 || v >= 0)) continue;
      throw ConfigError(fmt::format(
          "checkpoint file {}: tensor {} holds {} at element {}, {}: the checkpoint is damaged "
          "or its run had diverged; {}",
          file(q), tensor_key(unit, field), v, first + int64_t(i),
          std::isfinite(v) ? "a negative second moment" : "a value that is not finite",
          kOlderCheckpoint));
    }
  }

  Saved s_;
  std::vector<SafetensorsReader> files_;
  std::vector<float> buf_;                        // one piece, at most s_.piece elements
  std::array<int64_t, 3> cached_ = {-1, -1, -1};  // (file, tensor, piece) in buf_
};

void check_model(const Saved& s, const ModelConfig& m) {
  const ModelConfig saved =
      parse_model_config(s.info.model_json, s.info.path + "/meta.json (model)");
  const std::string diff = first_model_difference(saved, "the checkpoint", m, "this run's model");
  if (!diff.empty())
    throw ConfigError(
        fmt::format("checkpoint {} was written for another model: {}", s.info.path, diff));
  const std::vector<ZeroUnitLayout> layout = zero_layout(m, 1);
  bool same = s.units.size() == layout.size();
  for (size_t u = 0; same && u < layout.size(); ++u) same = s.units[u].numel == layout[u].numel;
  if (!same)
    throw ConfigError(
        fmt::format("checkpoint {}: meta.json's parameter units do not match its "
                    "model (the checkpoint is corrupt)",
                    s.info.path));
}

// ---- Writing ----

// The XXH3-64 of every piece of one tensor as the writer streams it, in order.
class PieceHasher {
 public:
  PieceHasher() : st_(XXH3_createState()) {}
  ~PieceHasher() { XXH3_freeState(st_); }
  PieceHasher(const PieceHasher&) = delete;
  PieceHasher& operator=(const PieceHasher&) = delete;
  const std::vector<uint64_t>& hashes() const { return out_; }

  // Elements [first, first + count) of a tensor of `total`, which follow the ones before.
  void add(const float* p, int64_t first, int64_t count, int64_t total) {
    if (first == 0) {
      XXH3_64bits_reset(st_);
      next_ = 0, in_piece_ = 0;
    }
    UPIPE_CHECK(first == next_, "the writer skipped elements [{}, {})", next_, first);
    while (count > 0) {
      const int64_t n = std::min(count, kCheckpointPiece - in_piece_);
      XXH3_64bits_update(st_, p, size_t(n) * 4);
      p += n, count -= n, next_ += n, in_piece_ += n;
      if (in_piece_ == kCheckpointPiece || next_ == total) {
        out_.push_back(XXH3_64bits_digest(st_));
        XXH3_64bits_reset(st_);
        in_piece_ = 0;
      }
    }
  }

 private:
  XXH3_state_t* st_;
  int64_t next_ = 0, in_piece_ = 0;
  std::vector<uint64_t> out_;
};

// The checksum of a rank file's safetensors header (its 8-byte length and the JSON); none when
// the length does not fit the file or a header's bound.
std::optional<uint64_t> header_xxh3(const ReadFile& rf) {
  uint64_t n = 0;
  if (rf.size() < 8) return std::nullopt;
  rf.read_at(&n, 8, 0);
  if (n > uint64_t(rf.size() - 8) || n > uint64_t(kMaxMetaBytes)) return std::nullopt;
  std::string head(size_t(8 + n), '\0');
  rf.read_at(head.data(), int64_t(head.size()), 0);
  return xxh3(head.data(), int64_t(head.size()));
}

// What rank 0 needs of every rank's file: its size, header checksum and piece checksums.
std::vector<uint64_t> file_record(const std::string& path, const PieceHasher& h) {
  const ReadFile rf(path, "checkpoint file");
  const std::optional<uint64_t> head = header_xxh3(rf);
  UPIPE_CHECK(head.has_value(), "{}: the header this rank just wrote does not fit its file", path);
  std::vector<uint64_t> r = {uint64_t(rf.size()), *head};
  r.insert(r.end(), h.hashes().begin(), h.hashes().end());
  return r;
}

// This rank's file, streamed from the device piece by piece (the writer's one staging buffer)
// and hashed as it goes.
std::vector<uint64_t> write_rank_file(const fs::path& tmp, const CheckpointRun& run, int64_t step,
                                      Zero3& z) {
  Communicator& world = z.world();
  Device& dev = z.device();
  PieceHasher hasher;
  std::vector<SafetensorsWriteItem> items;
  for (int u = 0; u < z.num_units(); ++u)
    for (int field = 0; field < kNumFields; ++field) {
      const Mat m = field == 0 ? z.master(u) : field == 1 ? z.exp_avg(u) : z.exp_avg_sq(u);
      items.push_back({tensor_key(u, field),
                       DType::kF32,
                       {m.cols},
                       nullptr,
                       [&dev, &hasher, m](int64_t first, int64_t count, void* dst) {
                         dev.copy(dst, m.at(0, first), mat_bytes(1, count, DType::kF32),
                                  CopyKind::kDeviceToHost);
                         hasher.add(static_cast<const float*>(dst), first, count, m.cols);
                       }});
    }
  const std::string path = (tmp / rank_file(world.rank())).string();
  write_safetensors(path, items,
                    {{"rank", std::to_string(world.rank())},
                     {"world", std::to_string(world.size())},
                     {"step", std::to_string(step)},
                     {"run_id", run.run_id}});
  return file_record(path, hasher);
}

// Rank 0, before it marks a checkpoint complete: every rank's file is in the directory it renames,
// of the size and header that rank wrote (a host that sees another directory under
// checkpoint.dir wrote its file there, and the checkpoint would miss it).
void check_rank_files(const fs::path& tmp, const std::vector<uint64_t>& records, int world) {
  const size_t per_rank = records.size() / size_t(world);
  for (int q = 0; q < world; ++q) {
    const uint64_t* r = records.data() + size_t(q) * per_rank;
    const std::string path = (tmp / rank_file(q)).string();
    std::error_code ec;
    const bool there = fs::is_regular_file(path, ec);
    const uint64_t bytes = there ? uint64_t(fs::file_size(path, ec)) : 0;
    const bool same = there && !ec && bytes == r[0] &&
                      header_xxh3(ReadFile(path, "checkpoint file")) == std::optional(r[1]);
    if (!same)
      throw ConfigError(fmt::format(
          "checkpoint {}: rank {} wrote its file {} ({} B), which rank 0 {}: every host must see "
          "one {} (a shared file system); the checkpoint is not marked complete",
          tmp.string(), q, rank_file(q), r[0],
          there ? fmt::format("finds with other contents ({} B)", bytes) : "does not find there",
          setting_ref("checkpoint.dir")));
  }
}

json meta_json(const CheckpointRun& run, int64_t step, Zero3& z, int cp_size,
               const std::string& run_toml, const std::vector<uint64_t>& records) {
  const int world = z.world().size();
  json units = json::array();
  for (int u = 0; u < z.num_units(); ++u)
    units.push_back({{"name", unit_name(z.model(), u)},
                     {"numel", z.layout(u).numel},
                     {"shard", z.layout(u).shard}});
  const size_t per_rank = records.size() / size_t(world);
  json files = json::array();
  for (int q = 0; q < world; ++q) {
    const uint64_t* r = records.data() + size_t(q) * per_rank;
    json pieces = json::array();
    for (size_t i = 2; i < per_rank; ++i) pieces.push_back(hex64(r[i]));
    files.push_back({{"name", rank_file(q)},
                     {"bytes", r[0]},
                     {"header_xxh3", hex64(r[1])},
                     {"pieces_xxh3", pieces}});
  }
  json meta = {{"format", kFormat},
          {"upipe", build_id()},
          {"run_id", run.run_id},
          {"step", step},
          {"world", world},
          {"cp_size", cp_size},
          {"units", units},
          {"model", model_config_json(z.model(), "float32")},
          {"run", run_toml},
          {"checksum", {{"algorithm", kChecksum}, {"piece_elements", kCheckpointPiece}}},
          {"files", files}};
  if (!run.data.empty()) meta["data"] = run.data;
  return meta;
}

// A step directory that holds no run id and no checkpoint file: a write that ended (a crash, a
// full disk) before it marked the directory, which every write does first. Nobody's data.
bool unmarked_leftover(const Entry& e) {
  if (!e.run_id.empty()) return false;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(e.path, ec))
    if (!f.path().filename().string().starts_with("run_id.tmp.")) return false;
  return !ec;
}

// A step directory some run wrote: it holds the run id every write puts there first, or a
// checkpoint's meta.json (readable or not).
bool marked(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / "run_id", ec) || fs::exists(dir / "meta.json", ec);
}
bool marked(const Entry& e) {
  return marked(e.path);
}

// A directory named like a checkpoint that no run wrote and that holds something (a user's
// `ckpt/step_5/notes.txt`): never replaced or removed, whatever --overwrite says.
bool not_a_checkpoint(const Entry& e) {
  return !marked(e) && !unmarked_leftover(e);
}

std::string not_a_checkpoint_text(const Entry& e) {
  return fmt::format(
      "{} is not a checkpoint (no run id, no meta.json) and holds files, which no run replaces or "
      "removes, --overwrite included; move it out of checkpoint.dir or choose another "
      "checkpoint.dir",
      e.path.string());
}

// Whether this run may replace the entry (its own, or another run's it was allowed to overwrite,
// or an unmarked leftover).
void check_ours(const CheckpointRun& run, const Entry& e) {
  if (not_a_checkpoint(e)) throw ConfigError(not_a_checkpoint_text(e));
  if (e.run_id == run.run_id || run.overwrite_others || unmarked_leftover(e)) return;
  throw ConfigError(fmt::format(
      "{} belongs to another run ({}); this run ({}) does not replace it: choose another "
      "checkpoint.dir, or pass --overwrite",
      e.path.string(), e.run_id.empty() ? "unreadable run id" : "run " + e.run_id, run.run_id));
}

// Rank 0, before any rank writes: the step's temporary directory, fresh and marked as ours.
void prepare_tmp(const CheckpointRun& run, int64_t step) {
  const fs::path dir(run.dir), tmp = dir / (step_dir_name(step) + ".tmp");
  fs::create_directories(dir);
  for (const fs::path& p : {dir / step_dir_name(step), tmp}) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(p, ec);
    if (fs::exists(st) && st.type() != fs::file_type::directory)
      throw ConfigError(
          fmt::format("{} exists and is not a directory; this run does not replace "
                      "it: remove it or choose another checkpoint.dir",
                      p.string()));
  }
  for (const Entry& e : list_entries(dir))
    if (e.step == step) check_ours(run, e);
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  write_file_atomic((tmp / "run_id").string(), run.run_id + "\n", "checkpoint run id");
}

// Collective: rank 0 runs `fn` on the checkpoint directory; a ConfigError there (a step of
// another run, a path that is not a directory) or a filesystem error (named with the directory)
// is thrown on every rank, so no rank is left waiting for the others.
template <class Fn>
void on_rank0_everywhere(Communicator& world, const std::string& dir, Fn&& fn) {
  upipe::on_rank0_everywhere(world, [&] {
    try {
      fn();
    } catch (const fs::filesystem_error& e) {
      throw ConfigError(fmt::format("checkpoint.dir = {}: {} ({}); choose another checkpoint.dir",
                                    dir, e.code().message(), e.path1().string()));
    }
  });
}

void prepare_tmp_everywhere(Communicator& world, const CheckpointRun& run, int64_t step) {
  on_rank0_everywhere(world, run.dir, [&] { prepare_tmp(run, step); });
}

// Rank 0, at a fresh run's start: checkpoint.dir is (made) a directory this process can write a
// file in, so that a bad path fails now instead of at the first checkpoint, steps later. The
// probe file is the run's own and removed at once.
void check_writable_dir(const CheckpointRun& run) {
  const fs::path dir(run.dir);
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (fs::exists(st) && !fs::is_directory(st))
    throw ConfigError(fmt::format(
        "checkpoint.dir = {} exists and is not a directory; choose another checkpoint.dir",
        run.dir));
  fs::create_directories(dir);
  const fs::path probe = dir / (".write_probe_" + run.run_id);
  write_file_atomic(probe.string(), "", "checkpoint directory probe");
  fs::remove(probe);
}

// Rank 0, after `step` is complete: this run's checkpoints beyond the newest run.keep, its stale
// temporaries and incomplete directories, and (overwrite_others) every other run's entries.
void prune(const CheckpointRun& run, int64_t step) {
  std::vector<Entry> ours;
  for (Entry& e : list_entries(run.dir)) {
    const bool mine = e.run_id == run.run_id;
    if (mine && e.complete)
      ours.push_back(std::move(e));
    else if ((mine && e.step != step) || (!mine && run.overwrite_others && marked(e)) ||
             unmarked_leftover(e))
      fs::remove_all(e.path);
  }
  if (run.keep > 0)
    for (size_t i = 0; i + size_t(run.keep) < ours.size(); ++i)
      if (ours[i].step < step) fs::remove_all(ours[i].path);
}

// Rank 0: an exclusive lock on checkpoint.dir/.upipe-lock, held until the process ends, so two
// jobs never write one directory at once (each pruned the other's checkpoints, or removed the
// other's checkpoint being written, and a run resumed twice wrote its metrics twice). The file
// says who holds it. A process takes a directory's lock once (a test resumes in-process).
void lock_checkpoint_dir(const std::string& dir) {
  static std::map<std::string, int> held;  // canonical directory -> the locked descriptor
  std::error_code ec;
  const std::string key = fs::weakly_canonical(fs::absolute(dir), ec).string();
  if (held.count(key)) return;
  const std::string path = (fs::path(dir) / kLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    throw ConfigError(fmt::format("checkpoint.dir = {}: cannot open its lock file {}: {}", dir,
                                  path, std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char who[256] = {};
    const ssize_t n = err == EWOULDBLOCK ? ::pread(fd, who, sizeof who - 1, 0) : 0;
    ::close(fd);
    std::string holder = n > 0 ? std::string(who, size_t(n)) : "";
    while (!holder.empty() && holder.back() == '\n') holder.pop_back();
    if (err == EWOULDBLOCK)
      throw ConfigError(fmt::format(
          "checkpoint.dir = {} is in use by another upipe job ({}): two jobs writing one "
          "directory would remove each other's checkpoints; wait for it to end, or choose another "
          "checkpoint.dir",
          dir, holder.empty() ? "its lock file " + path : excerpt(holder)));
    // A file system without locks (Lustre mounted without flock, some FUSE ones): the run goes
    // on, said once, unguarded against a second job.
    std::fprintf(stderr,
                 "upipe: warning: checkpoint.dir = %s cannot be locked (%s): a second job writing "
                 "there at the same time would not be refused\n",
                 dir.c_str(), std::strerror(err));
    held[key] = -1;
    return;
  }
  const std::string who = fmt::format("pid {} on {}\n", ::getpid(), host_name());
  if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, who.data(), who.size(), 0) < 0) {
    // The lock holds whatever the file says; its text only names the holder.
  }
  held[key] = fd;
}

// Rank 0, for --resume: this run's step directories newer than the one continued that are not
// complete (no DONE: a write that did not finish, or an older build's rename before DONE) are
// said, not skipped silently: the run continues from an older step and replaces or removes them.
void warn_skipped_incomplete(const std::string& dir, const CheckpointStart& cs, int64_t from) {
  for (const Entry& e : list_entries(dir))
    if (!e.tmp && !e.complete && e.step > from && e.run_id == cs.run.run_id)
      std::fprintf(stderr,
                   "upipe: warning: --resume skips %s: it has no DONE marker, so it is an "
                   "incomplete checkpoint (its write did not finish) and is never loaded; the run "
                   "continues from %s, the newest complete one, and replaces or removes %s at its "
                   "next checkpoint (move it out of checkpoint.dir to keep it)\n",
                   e.path.string().c_str(), fs::path(*cs.resume_from).filename().c_str(),
                   e.path.filename().c_str());
}

}  // namespace

// Rank 0, as a run opens checkpoint.dir: the directory's lock, then a directory no run wrote is
// said now, not when the run reaches its step (prepare_tmp would refuse it there).
void lock_and_scan(const std::string& dir) {
  lock_checkpoint_dir(dir);
  refuse_odd_step_entries(dir);
  for (const Entry& e : list_entries(dir))
    if (not_a_checkpoint(e)) throw ConfigError(not_a_checkpoint_text(e));
}

void check_checkpoint_room(Communicator& world, const std::string& dir, int64_t bytes) {
  on_rank0_everywhere(world, dir, [&] {
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) != 0) return;  // said by the first write, naming the file
    if (st.f_flag & ST_RDONLY)
      throw ConfigError(fmt::format(
          "checkpoint.dir = {} is on a read-only file system: no checkpoint could be written; "
          "choose another checkpoint.dir",
          dir));
    const double free_bytes = double(st.f_bavail) * double(st.f_frsize);
    if (free_bytes < double(bytes))
      throw ConfigError(fmt::format(
          "checkpoint.dir = {} has {} free, and one checkpoint of this run takes {} (fp32 weights "
          "and two AdamW moments): no checkpoint could be written; free space or choose another "
          "checkpoint.dir",
          dir, format_bytes(int64_t(free_bytes)), format_bytes(bytes)));
  });
}

namespace {

// The file rank 0 writes in checkpoint.dir for the other ranks to find: a name and text no other
// directory holds by chance.
struct ViewProbe {
  fs::path path;
  std::string text;
};
ViewProbe view_probe(const std::string& dir, uint64_t token) {
  return {fs::path(dir) / fmt::format(".upipe-view-{}", hex64(token)), hex64(token) + "\n"};
}

// Whether this rank reads rank 0's probe. A shared file system that caches metadata (FUSE
// mounts of object stores) may show a new file late: it is looked for up to 5 s.
bool sees(const ViewProbe& p) {
  auto there = [&p] {
    std::error_code ec;
    return fs::is_regular_file(p.path, ec) &&
           read_small_file(p.path.string(), "checkpoint directory probe", 64) == p.text;
  };
  for (int i = 0; i < 50; ++i) {
    if (there()) return true;
    watchdog_beat();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return there();
}

}  // namespace

void check_one_checkpoint_dir(Communicator& world, const std::string& dir) {
  if (world.size() == 1) return;
  uint64_t token = 0;
  on_rank0_everywhere(world, dir, [&] {
    token = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);
    const ViewProbe p = view_probe(dir, token);
    write_file_atomic(p.path.string(), p.text, "checkpoint directory probe");
  });
  world.broadcast(&token, sizeof token, 0);
  const ViewProbe probe = view_probe(dir, token);
  const std::string host0 = host_names(world)[0];
  std::error_code ec;
  const std::string mine = fs::absolute(dir, ec).string();  // as this rank resolves the path
  const std::string where0 = broadcast_string(world, mine, 0);
  auto check = [&] {
    if (world.rank() == 0 || sees(probe)) return;
    throw ConfigError(fmt::format(
        "rank {} (host {}) does not see the file {} that rank 0 (host {}) wrote in {}{}: every "
        "rank writes its part of each checkpoint there, so every host must see that one "
        "directory (a shared file system); give a {} that every host mounts",
        world.rank(), host_name(), probe.path.filename().string(), host0,
        setting_value("checkpoint.dir", where0),
        mine == where0 ? std::string()
                       : fmt::format(" (rank {} reads the path as {})", world.rank(), mine),
        setting_ref("checkpoint.dir")));
  };
  try {
    on_every_rank_everywhere(world, check);
  } catch (...) {
    if (world.rank() == 0) fs::remove(probe.path, ec);
    throw;
  }
  on_rank0_everywhere(world, dir, [&] { fs::remove(probe.path); });
}

std::string newest_checkpoint_everywhere(Communicator& world, const std::string& dir) {
  // No directory: said as on one rank, before a probe is written there.
  on_rank0_everywhere(world, dir, [&] {
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      throw ConfigError(fmt::format("--resume: no complete checkpoint in {} (no such directory)",
                                    setting_value("checkpoint.dir", dir)));
  });
  check_one_checkpoint_dir(world, dir);
  std::optional<std::string> mine;
  on_every_rank_everywhere(world, [&] {
    refuse_odd_step_entries(dir);
    mine = latest_checkpoint(dir);
  });
  // Each rank's newest complete step (-1: none), checked against rank 0's: a file system that
  // shows hosts other listings (an NFS cache, a copy) would load other weights on some ranks.
  int64_t step = -1;
  bool tmp = false;
  if (mine) parse_step_name(fs::path(*mine).filename().string(), &step, &tmp);
  std::vector<int64_t> steps(size_t(world.size()));
  world.all_gather(&step, steps.data(), sizeof step);
  if (steps[0] < 0)
    throw ConfigError(fmt::format("--resume: no complete checkpoint in {}",
                                  setting_value("checkpoint.dir", dir)));
  auto named = [](int64_t s) { return s < 0 ? std::string("none") : step_dir_name(s); };
  const std::vector<std::string> hosts = host_names(world);
  for (int r = 1; r < world.size(); ++r)
    if (steps[size_t(r)] != steps[0])
      throw ConfigError(fmt::format(
          "--resume: rank {} (host {}) finds {} the newest complete checkpoint in {}, rank 0 "
          "(host {}) finds {}: every rank must load one checkpoint, so every host must see the "
          "same {} (a shared file system, its writes visible everywhere)",
          r, hosts[size_t(r)], named(steps[size_t(r)]), setting_value("checkpoint.dir", dir),
          hosts[0], named(steps[0]), setting_ref("checkpoint.dir")));
  return *mine;
}

CheckpointStart open_checkpoint_run(Communicator& world, const std::string& dir, bool resume,
                                    bool overwrite, int keep,
                                    const std::function<bool(int64_t)>& writes_step) {
  CheckpointStart cs;
  cs.run = {dir, "", keep, overwrite, ""};
  if (resume) {
    if (dir.empty())
      throw ConfigError("--resume needs checkpoint.dir (the run's checkpoint directory)");
    if (overwrite)
      throw ConfigError(
          "--overwrite is for a fresh run; --resume continues the run in "
          "checkpoint.dir");
    on_rank0_everywhere(world, dir, [&] { lock_and_scan(dir); });  // before it is read
    newest_checkpoint_everywhere(world, dir);  // one directory, one newest step on every rank
    std::set<std::string> runs;
    int64_t from = 0;  // the step continued from
    for (const Entry& e : list_entries(dir))
      if (e.complete) {
        runs.insert(e.run_id);
        cs.resume_from = e.path.string();
        cs.run.run_id = e.run_id;
        from = e.step;
      }
    if (!cs.resume_from)
      throw ConfigError(
          fmt::format("--resume: no complete checkpoint in checkpoint.dir = {}", dir));
    if (runs.size() > 1)
      throw ConfigError(fmt::format(
          "--resume: checkpoint.dir = {} holds checkpoints of {} runs; which to continue is "
          "ambiguous: move the other run's step_* directories away",
          dir, runs.size()));
    // Another run's checkpoint being written, or left incomplete (a temporary, or a directory an
    // older build renamed before its DONE): a run started over this one (--overwrite) that ended
    // before its first complete checkpoint. Continuing the older run silently would not be what
    // was last started.
    for (const Entry& e : list_entries(dir)) {
      // A step directory that cannot be read (its meta.json missing or damaged) past the one
      // continued: the run would train up to that step and fail to replace it there.
      if (!e.tmp && e.run_id.empty() && e.step > from && marked(e) &&
          (!writes_step || writes_step(e.step)))
        throw ConfigError(fmt::format(
            "--resume: checkpoint.dir = {} holds {}, a checkpoint that cannot be read (its "
            "meta.json is missing or damaged), newer than {}, the newest complete one: the run "
            "would stop at step {}, which it cannot replace; move {} out of checkpoint.dir to "
            "continue from step {}",
            dir, e.path.filename().string(), fs::path(*cs.resume_from).filename().string(), e.step,
            e.path.string(), from));
      if ((e.tmp || !e.complete) && !e.run_id.empty() && e.run_id != cs.run.run_id)
        throw ConfigError(fmt::format(
            "--resume: checkpoint.dir = {} holds {}, an incomplete checkpoint of another run "
            "(run {}) than its newest complete one ({}, run {}): a run started over it "
            "(--overwrite) ended before its first checkpoint. Start that run again with "
            "--overwrite, or remove {} to continue run {}",
            dir, e.path.filename().string(), e.run_id,
            fs::path(*cs.resume_from).filename().string(), cs.run.run_id, e.path.string(),
            cs.run.run_id));
    }
    if (world.rank() == 0) warn_skipped_incomplete(dir, cs, from);
    return cs;
  }
  cs.run.run_id = new_run_id(world);
  if (dir.empty()) return cs;
  on_rank0_everywhere(world, dir, [&] {
    check_writable_dir(cs.run);
    lock_and_scan(dir);
  });
  check_one_checkpoint_dir(world, dir);  // now, not at the first checkpoint steps later
  std::vector<Entry> entries = list_entries(dir);
  if (overwrite) {
    // What --overwrite will remove, said before a step runs (it went without a word).
    std::erase_if(entries, [](const Entry& e) { return !marked(e); });
    if (world.rank() == 0 && !entries.empty())
      std::fprintf(
          stderr,
          "upipe: note: --overwrite: %s holds %zu checkpoint entr%s of another run "
          "(%s%s), removed after this run's first complete checkpoint\n",
          dir.c_str(), entries.size(), entries.size() == 1 ? "y" : "ies",
          entries.front().path.filename().c_str(),
          entries.size() > 1 ? (" ... " + entries.back().path.filename().string()).c_str() : "");
    return cs;
  }
  // An empty, unmarked step_N(.tmp) (a write that ended before it marked its directory) is
  // nobody's data: replaced like the run's own.
  std::erase_if(entries, [](const Entry& e) { return unmarked_leftover(e); });
  if (!entries.empty())
    throw ConfigError(fmt::format(
        "checkpoint.dir = {} holds checkpoints of another run ({}, {} in all): continue it with "
        "--resume, choose another checkpoint.dir, or pass --overwrite to replace them",
        dir, entries.back().path.filename().string(), entries.size()));
  return cs;
}

std::string save_checkpoint(const CheckpointRun& run, int64_t step, Zero3& z, int cp_size,
                            const std::string& run_toml) {
  Communicator& world = z.world();
  const fs::path dir(run.dir), final_dir = dir / step_dir_name(step);
  const fs::path tmp = dir / (step_dir_name(step) + ".tmp");
  prepare_tmp_everywhere(world, run, step);
  const std::vector<uint64_t> mine = write_rank_file(tmp, run, step, z);
  fault_point("checkpoint");
  std::vector<uint64_t> records(mine.size() * size_t(world.size()));
  world.all_gather(mine.data(), records.data(), int64_t(mine.size() * sizeof(uint64_t)));
  on_rank0_everywhere(world, run.dir, [&] {
    check_rank_files(tmp, records, world.size());
    const std::string meta = meta_json(run, step, z, cp_size, run_toml, records).dump(1) + "\n";
    write_file_atomic((tmp / "meta.json").string(), meta, "checkpoint metadata");
    // DONE before the rename, so a step_N directory is complete from the moment it has its name
    // (a full disk at DONE left a renamed directory without it, which hid a newer run's start).
    write_file_atomic((tmp / "DONE").string(),
                      fmt::format("step {}\nmeta.json {} {}\n", step, kChecksum,
                                  hex64(xxh3(meta.data(), int64_t(meta.size())))),
                      "checkpoint marker");
    fsync_directory(tmp.string());
    fs::remove_all(final_dir);  // ours or allowed: prepare_tmp checked
    fs::rename(tmp, final_dir);
    fsync_directory(dir.string());
    prune(run, step);
  });
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  std::optional<std::string> latest;
  for (const Entry& e : list_entries(dir))
    if (e.complete) latest = e.path.string();
  return latest;
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  return read_saved(path).info;
}

CheckpointInfo load_checkpoint(const std::string& path, Zero3& z) {
  Saved s = read_saved(path);
  check_model(s, z.model());
  const CheckpointInfo info = s.info;
  RankFiles files(std::move(s));
  fault_point("resume");
  Device& dev = z.device();
  std::vector<float> host;  // one chunk, at most kCheckpointPiece elements
  for (int u = 0; u < z.num_units(); ++u) {
    const ZeroUnitLayout& l = z.layout(u);
    const int64_t lo = z.shard_first(u), hi = std::min(lo + l.shard, l.numel);
    for (int field = 0; field < kNumFields; ++field) {
      const Mat dst = field == 0 ? z.master(u) : field == 1 ? z.exp_avg(u) : z.exp_avg_sq(u);
      zero(dev, dst);  // the padding
      if (!dev.backend().computes()) continue;
      for (int64_t c = lo; c < hi; c += kCheckpointPiece) {
        const int64_t n = std::min(kCheckpointPiece, hi - c);
        host.resize(size_t(n));
        files.read(u, field, c, c + n, host.data());
        upload(dev, host.data(), dst.block(0, 1, c - lo, n));
      }
    }
  }
  return info;
}

struct CheckpointReader::Impl {
  explicit Impl(Saved s) : files(std::move(s)) {}
  RankFiles files;
  std::vector<ZeroUnitLayout> layout;
};

CheckpointReader::CheckpointReader(const std::string& path) {
  Saved s = read_saved(path);
  info_ = s.info;
  m_ = parse_model_config(info_.model_json, path + "/meta.json (model)");
  check_model(s, m_);
  impl_ = std::make_unique<Impl>(std::move(s));
  impl_->layout = zero_layout(m_, 1);
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
  fault_point("export");
  const auto [u, i] = locate(tensor_index);
  const ZeroUnitLayout& l = impl_->layout[u];
  const int64_t numel = l.tensors[i].numel();
  UPIPE_CHECK(first >= 0 && count >= 0 && first <= numel && count <= numel - first,
              "elements [{}, {} + {}) of {}, which has {}", first, first, count, l.tensors[i].name,
              numel);
  const int64_t a = l.offsets[i] + first;
  impl_->files.read(int(u), 0, a, a + count, dst);
}

bool is_checkpoint_step_dir(const fs::path& dir) {
  return is_step_dir_name(dir.filename().string()) && marked(dir);
}

}  // namespace upipe
