// Resuming: the recorded run continues; settings that differ are reported by what they mean, and
// the ones that change what the remaining steps compute on (model, data, S, batch) are refused
// unless accepted; no step left is an error.
#include <gtest/gtest.h>

#include "train/resume.h"
#include "unit/expect_config_error.h"

namespace upipe {
namespace {

RecordedRun recorded() {
  RecordedRun r;
  r.config.train.steps = 100;
  r.config.data.kind = "random";
  r.step = 40;
  r.world = 2;
  r.cp_size = 2;
  r.source = "ckpt/step_00000040";
  return r;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

TEST(Resume, TheRecordedRunContinuesUnchanged) {
  const RecordedRun rec = recorded();
  EXPECT_TRUE(setting_changes(rec.config, rec.config).empty());
  const std::vector<std::string> lines = check_resume(rec, rec.config, 2, false);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("continues from step 40"), std::string::npos);
}

TEST(Resume, ChangesAreReportedByWhatTheyMean) {
  const RecordedRun rec = recorded();
  RunConfig now = rec.config;
  now.train.steps = 200;               // schedule
  now.parallel.knobs.method = "ring";  // arithmetic
  now.metrics.path = "m.jsonl";        // free
  const std::vector<SettingChange> c = setting_changes(rec.config, now);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].key, "parallel.method");
  EXPECT_EQ(c[0].rule, ResumeRule::kArithmetic);
  EXPECT_EQ(c[1].key, "train.steps");
  EXPECT_EQ(c[1].from, "100");
  EXPECT_EQ(c[1].to, "200");
  EXPECT_EQ(c[1].rule, ResumeRule::kSchedule);
  EXPECT_EQ(c[2].rule, ResumeRule::kFree);
  const std::string out = joined(check_resume(rec, now, 2, false));
  EXPECT_NE(out.find("--steps 100 -> 200: the schedule"), std::string::npos) << out;
  EXPECT_NE(out.find("--method upipe -> ring: the same computation in other arithmetic"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("learning rate at step 41"), std::string::npos) << out;
  // Fewer ranks with the same DP size (the CP group shrinks): re-cut shards, allowed.
  RunConfig one = rec.config;
  EXPECT_NE(joined(check_resume(rec, one, 1, false)).find("2 -> 1 ranks"), std::string::npos);
}

TEST(Resume, ChangesOfWhatIsComputedAreRefusedUnlessAccepted) {
  const RecordedRun rec = recorded();
  for (const auto& [flag, set] : std::vector<std::pair<std::string, void (*)(RunConfig&)>>{
           {"--seq-len", [](RunConfig& c) { c.train.seq_len = 2048; }},
           {"--data-kind", [](RunConfig& c) { c.data.kind = "copy"; }},
           {"--micro-steps", [](RunConfig& c) { c.train.micro_steps = 2; }},
           {"--seed", [](RunConfig& c) { c.train.seed = 9; }}}) {
    SCOPED_TRACE(flag);
    RunConfig now = rec.config;
    set(now);
    expect_config_error([&] { check_resume(rec, now, 2, false); },
                        {flag, "would change what the remaining steps", "--accept-changes"});
    EXPECT_NE(joined(check_resume(rec, now, 2, true)).find("accepted"), std::string::npos);
  }
  // Another DP size changes the global batch: 2 ranks as DP 2 instead of one CP group.
  RunConfig dp2 = rec.config;
  dp2.parallel.cp_size = 1;
  expect_config_error([&] { check_resume(rec, dp2, 2, false); }, {"DP 1 -> 2"});
}

// The model's folder moved: said, not refused (another model is refused when it loads, by the
// checkpoint's config).
TEST(Resume, TheModelsFolderMovedIsSaid) {
  const RecordedRun rec = recorded();
  RunConfig now = rec.config;
  now.model.name = "/elsewhere/model";
  const std::string out = joined(check_resume(rec, now, 2, false));
  EXPECT_NE(out.find("-> /elsewhere/model: the model there must be the run's"), std::string::npos)
      << out;
}

// An older run of the copy task that named a file it never read resumes as it ran (validation
// now refuses a path with another data.kind); the files task keeps its paths.
TEST(Resume, PathsTheCopyTaskNeverReadAreDropped) {
  RunConfig copy;
  copy.data.kind = "copy";
  copy.data.path = "/data/corpus.bin";
  copy.data.val_path = "/data/val.bin";
  const std::vector<std::string> notes = drop_unread_paths(copy);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("data.path = /data/corpus.bin was never read (data.kind = copy)"),
            std::string::npos)
      << notes[0];
  EXPECT_TRUE(copy.data.path.empty() && copy.data.val_path.empty());
  EXPECT_NO_THROW(validate(copy, kScopeTrain));
  RunConfig files = copy;
  files.data.kind = "files";
  files.data.path = "/data/corpus.bin";
  EXPECT_TRUE(drop_unread_paths(files).empty());
  EXPECT_EQ(files.data.path, "/data/corpus.bin");
}

// Another split of the same global batch (DP x micro_steps) reads the same sequences a step: said,
// not refused. Another global batch is refused.
TEST(Resume, TheSameGlobalBatchCutOtherwiseContinues) {
  RecordedRun rec = recorded();  // 2 ranks, one CP group: DP 1
  rec.config.train.micro_steps = 2;
  RunConfig now = rec.config;
  now.parallel.cp_size = 1;  // DP 2
  now.train.micro_steps = 1;
  const std::string out = joined(check_resume(rec, now, 2, false));
  EXPECT_NE(out.find("DP 1 x 2 micro-steps -> DP 2 x 1 on 2 ranks: the same global batch of 2 "
                     "sequences a step"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("--micro-steps"), std::string::npos) << out;
  now.train.micro_steps = 2;  // DP 2 x 2: twice the batch
  expect_config_error([&] { check_resume(rec, now, 2, false); }, {"DP 1 -> 2", "--accept-changes"});
}

// A moved data path is the same run when the data read there is the checkpoint's: the loop
// compares the fingerprints as it reads the data. A checkpoint that recorded none cannot tell.
TEST(Resume, AMovedDataPathIsCheckedByTheDataItHolds) {
  RecordedRun rec = recorded();
  rec.config.data.kind = "files";
  rec.config.data.path = "/old/corpus";
  rec.data = "3000 tokens, xxh3 0123456789abcdef";
  RunConfig now = rec.config;
  now.data.path = "/new/corpus";
  const std::string out = joined(check_resume(rec, now, 2, false));
  EXPECT_NE(out.find("--data-path /old/corpus -> /new/corpus: the data read there must be the "
                     "run's (3000 tokens, xxh3 0123456789abcdef)"),
            std::string::npos)
      << out;
  rec.data.clear();
  expect_config_error([&] { check_resume(rec, now, 2, false); },
                      {"--data-path /old/corpus -> /new/corpus", "--accept-changes"});
}

TEST(Resume, NoStepLeftIsAnError) {
  const RecordedRun rec = recorded();
  RunConfig now = rec.config;
  now.train.steps = 40;
  expect_config_error([&] { check_resume(rec, now, 2, false); },
                      {"has done 40 steps", "leaves none to do"});
}

}  // namespace
}  // namespace upipe
