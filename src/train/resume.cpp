#include "train/resume.h"

#include <fmt/format.h>

#include "core/errors.h"
#include "train/trainer.h"

namespace upipe {
namespace {

int dp_of(int world, int cp_size) {
  return cp_size > 0 && world % cp_size == 0 ? world / cp_size : 1;
}

LrSchedule schedule_of(const RunConfig& c) {
  return {c.train.lr, c.min_lr(), c.train.warmup_steps, c.train.steps};
}

std::string flag_of(const std::string& key) {
  const SettingInfo* s = find_setting(key);
  return s ? s->flag : key;
}

}  // namespace

std::vector<SettingChange> setting_changes(const RunConfig& recorded, const RunConfig& now) {
  const auto a = setting_values(recorded), b = setting_values(now);
  std::vector<SettingChange> out;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].second != b[i].second)
      out.push_back({a[i].first, a[i].second, b[i].second, find_setting(a[i].first)->resume});
  return out;
}

std::vector<std::string> check_resume(const RecordedRun& rec, const RunConfig& now, int world,
                                      bool accept) {
  if (now.train.steps <= rec.step)
    throw ConfigError(fmt::format(
        "--resume: the run in {} has done {} steps, and {} leaves none to do; give a larger {} "
        "to train on",
        rec.source, rec.step, setting_value("train.steps", now.train.steps),
        setting_ref("train.steps")));
  std::vector<std::string> lines{
      fmt::format("resume: the run recorded in {} continues from step {}", rec.source, rec.step)};
  std::string breaks;
  auto add_break = [&](const std::string& what) { breaks += (breaks.empty() ? "" : "; ") + what; };
  const int dp_rec = dp_of(rec.world, rec.cp_size);
  const int cp_now = now.parallel.cp_size > 0 ? now.parallel.cp_size : world;
  const int dp_now = dp_of(world, cp_now);
  // The data of a step is its global batch, sequences [step x G, (step + 1) x G) with G = DP x
  // micro_steps (DataSource::global_index), whatever DP and micro_steps make G: another split of
  // the same G reads the same sequences, its gradient summed in another order.
  const int64_t g_rec = int64_t(dp_rec) * rec.config.train.micro_steps,
                g_now = int64_t(dp_now) * now.train.micro_steps;
  const bool same_batch_recut =
      g_rec == g_now && (dp_now != dp_rec || rec.config.train.micro_steps != now.train.micro_steps);
  if (same_batch_recut)
    lines.push_back(fmt::format(
        "  DP {} x {} micro-steps -> DP {} x {} on {} ranks: the same global batch of {} "
        "sequences a step, cut otherwise (the same data, summed in another order: not bitwise "
        "the uninterrupted run)",
        dp_rec, rec.config.train.micro_steps, dp_now, now.train.micro_steps, world, g_now));
  else if (dp_now != dp_rec)
    add_break(fmt::format("DP {} -> {} on {} ranks (the global batch: {} x {} sequences a step)",
                          dp_rec, dp_now, world, dp_now, now.train.micro_steps));
  else if (world != rec.world)
    lines.push_back(
        fmt::format("  {} -> {} ranks: the shards are re-cut (the same batch)", rec.world, world));
  bool schedule = false;
  for (const SettingChange& c : setting_changes(rec.config, now)) {
    if (same_batch_recut && c.key == "train.micro_steps") continue;  // said above
    // The recorded values come from a checkpoint's file: one line, control bytes escaped.
    const std::string what = one_line(fmt::format("{} {} -> {}", flag_of(c.key), c.from, c.to));
    switch (c.rule) {
      case ResumeRule::kBreaks:
        add_break(what);
        break;
      case ResumeRule::kSchedule:
        lines.push_back("  " + what + ": the schedule and optimizer from the next step");
        schedule = true;
        break;
      case ResumeRule::kArithmetic:
        lines.push_back("  " + what +
                        ": the same computation in other arithmetic (not bitwise the "
                        "uninterrupted run)");
        break;
      case ResumeRule::kFree:
        lines.push_back("  " + what);
        break;
      case ResumeRule::kModel:
        // The model moved (a Hugging Face folder copied elsewhere): the same model is the same
        // run; its config is compared with the checkpoint's when it loads (check_model).
        lines.push_back("  " + what +
                        ": the model there must be the run's (its config is compared with the "
                        "checkpoint's)");
        break;
      case ResumeRule::kData:
        // The data moved: the same data is the same run (the fingerprint is compared when the
        // data is read); a checkpoint without a fingerprint cannot tell.
        if (rec.data.empty())
          add_break(what);
        else
          lines.push_back("  " + what + ": the data read there must be the run's (" +
                          one_line(rec.data) + ")");
        break;
    }
  }
  if (schedule)
    lines.push_back(fmt::format("  learning rate at step {}: {:.4g} (the recorded run's: {:.4g})",
                                rec.step + 1, schedule_of(now).lr_at(rec.step),
                                schedule_of(rec.config).lr_at(rec.step)));
  if (!breaks.empty()) {
    if (!accept)
      throw ConfigError(fmt::format(
          "--resume: {} would change what the remaining steps of the run in {} compute on; "
          "drop them to continue that run, or add --accept-changes",
          breaks, rec.source));
    lines.push_back("  accepted (--accept-changes): " + breaks);
  }
  return lines;
}

std::vector<std::string> drop_unread_paths(RunConfig& recorded) {
  std::vector<std::string> notes;
  if (recorded.data.kind == "files") return notes;
  for (const auto& [key, path] : {std::pair{"data.path", &recorded.data.path},
                                  std::pair{"data.val_path", &recorded.data.val_path}})
    if (!path->empty()) {
      notes.push_back(one_line(fmt::format(
          "the recorded {} = {} was never read (data.kind = {}): the run resumes without it", key,
          *path, recorded.data.kind)));
      path->clear();
    }
  return notes;
}

}  // namespace upipe
