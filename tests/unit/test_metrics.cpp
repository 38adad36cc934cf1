// Step metrics: the JSONL object's keys, order and values; the writer's flush-per-step, truncate
// on a new run and keep-then-append on resume; the log line, durations, counts, progress bar
// and both display modes; the start-up table.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/errors.h"
#include "train/flops.h"
#include "train/metrics.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

StepMetrics sample_metrics(int64_t step) {
  StepMetrics m;
  m.step = step;
  m.loss = 5.4321;
  m.grad_norm = 1.25;
  m.lr = 3e-4;
  m.tokens_per_s = 12345.6;
  m.mfu = 0.123;
  m.peak_bytes = int64_t(3) << 29;  // 1.5 GiB
  m.peak_by_tag = {{"params", 1000}, {"act", 2000}};
  m.budget_bytes = int64_t(2) << 30;
  m.step_s = 0.5;
  m.eta_s = 3723;
  return m;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

TEST(Metrics, JsonKeysOrderAndValues) {
  StepMetrics m = sample_metrics(7);
  const std::string line = metrics_json(m);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const auto j = nlohmann::ordered_json::parse(line);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys,
            (std::vector<std::string>{"step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu",
                                      "peak_bytes", "peak_by_tag", "host_peak_bytes",
                                      "host_peak_by_tag", "budget_bytes", "step_s", "eta_s"}));
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["loss"].get<double>(), 5.4321);  // doubles round-trip exactly
  EXPECT_EQ(j["lr"].get<double>(), 3e-4);
  EXPECT_EQ(j["peak_bytes"], int64_t(3) << 29);
  EXPECT_EQ(j["peak_by_tag"]["act"], 2000);
  EXPECT_EQ(j["peak_by_tag"]["params"], 1000);
  m.copy_loss = 0.75;
  m.loss = std::nan("");
  const auto c = nlohmann::ordered_json::parse(metrics_json(m));
  EXPECT_EQ(std::next(c.begin(), 2).key(), "copy_loss");  // right after loss
  EXPECT_EQ(c["copy_loss"].get<double>(), 0.75);
  EXPECT_TRUE(c["loss"].is_null());  // NaN is not JSON
  m.run_id = "0123abcd";
  const auto r = nlohmann::ordered_json::parse(metrics_json(m));
  EXPECT_EQ(std::next(r.begin(), 1).key(), "run");  // right after step
  EXPECT_EQ(r["run"], "0123abcd");
  // A validation step: its loss and its time, after the copy loss.
  m.val_loss = 4.5;
  m.val_s = 1.25;
  const auto v = nlohmann::ordered_json::parse(metrics_json(m));
  EXPECT_EQ(std::next(v.begin(), 4).key(), "val_loss");
  EXPECT_EQ(std::next(v.begin(), 5).key(), "val_s");
  EXPECT_EQ(v["val_s"].get<double>(), 1.25);
}

TEST(Metrics, WriterFlushesEachStepAndTruncatesANewRunWithOverwrite) {
  TempDir d;
  const std::string p = d.write("m.jsonl", "{\"step\": 99}\n");
  {
    MetricsWriter w(p, -1, /*overwrite=*/true);
    w.write(sample_metrics(1));
    // Flushed: another reader sees the line while the writer is still open.
    ASSERT_EQ(lines_of(p).size(), 1u);
    w.write(sample_metrics(2));
    EXPECT_EQ(lines_of(p).size(), 2u);
  }
  const auto l = lines_of(p);
  EXPECT_EQ(nlohmann::json::parse(l[0])["step"], 1);
  EXPECT_EQ(nlohmann::json::parse(l[1])["step"], 2);
}

TEST(Metrics, ResumeKeepsTheCheckpointedStepsAndAppends) {
  TempDir d;
  const std::string p = d.file("m.jsonl");
  {
    MetricsWriter w(p);
    for (int64_t s = 1; s <= 5; ++s) w.write(sample_metrics(s));
  }
  {
    std::ofstream torn(p, std::ios::app);
    torn << "{\"step\": 6, \"loss\"";  // a crash mid-line
  }
  {
    MetricsWriter w(p, 3);  // the checkpoint holds step 3: steps 4-6 are run again
    w.write(sample_metrics(4));
  }
  std::vector<int64_t> steps;
  for (const std::string& l : lines_of(p)) steps.push_back(nlohmann::json::parse(l)["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
  // Resuming with no file yet starts one.
  MetricsWriter fresh(d.file("new.jsonl"), 10);
  fresh.write(sample_metrics(11));
  EXPECT_EQ(lines_of(d.file("new.jsonl")).size(), 1u);
}

// A resumed run keeps its own lines and those without a run id (older upipe), and refuses a file
// with another run's line (a --metrics-path onto another run's file), leaving it as it was.
TEST(Metrics, ResumeRefusesAnotherRunsLines) {
  TempDir d;
  const std::string p = d.file("m.jsonl");
  auto line = [](int64_t step, const std::string& run) {
    StepMetrics m = sample_metrics(step);
    m.run_id = run;
    return metrics_json(m) + "\n";
  };
  const std::string mine = line(1, "") + line(2, "aaaa") + line(3, "aaaa");
  d.write("m.jsonl", mine);
  {
    MetricsWriter w(p, 2, false, "aaaa");
    EXPECT_EQ(w.dropped_lines(), 1);
  }
  EXPECT_EQ(lines_of(p).size(), 2u);
  const std::string other = line(1, "bbbb") + line(2, "bbbb");
  d.write("o.jsonl", other);
  try {
    MetricsWriter w(d.file("o.jsonl"), 2, false, "aaaa");
    ADD_FAILURE() << "another run's metrics file was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("line 1 (step 1) is of another run (bbbb) than the one "
                                         "resumed (aaaa)"),
              std::string::npos)
        << e.what();
  }
  std::ifstream f(d.file("o.jsonl"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), other);
}

// A step is a whole number from 1: 2^64 - 1 (read as int64 it was step -1, kept on every resume),
// 0 and -1 make the line no step's metrics, so the file is not taken.
TEST(Metrics, ResumeRefusesStepsOutOfRange) {
  TempDir d;
  const std::string good = metrics_json(sample_metrics(1)) + "\n";
  for (const char* step : {"18446744073709551615", "0", "-1", "2.5"}) {
    std::string bad = metrics_json(sample_metrics(2));
    bad.replace(bad.find("\"step\":2"), 8, std::string("\"step\":") + step);
    d.write("m.jsonl", good + bad + "\n");
    try {
      MetricsWriter w(d.file("m.jsonl"), 1, false, "");
      ADD_FAILURE() << "a metrics line with step " << step << " was taken";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("line 2 is not a step's metrics"), std::string::npos)
          << step << ": " << e.what();
    }
  }
}

// What the run did not write is not replaced: an existing file on a fresh run (unless
// overwrite), a file with a line that is not a step's metrics on a resumed run.
TEST(Metrics, WriterRefusesFilesThatAreNotTheRunsOwn) {
  TempDir d;
  const std::string notes = d.write("notes.txt", "my notes\n");
  EXPECT_THROW(MetricsWriter{notes}, ConfigError);
  try {
    check_metrics_file(notes, false, false);
    ADD_FAILURE() << "an existing file was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("already exists (9 bytes)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((MetricsWriter{notes, 3}), ConfigError);  // resume: not a metrics file
  EXPECT_EQ(lines_of(notes), (std::vector<std::string>{"my notes"}));
  // An empty file, or none, is fine for a fresh run.
  const std::string empty = d.write("empty.jsonl", "");
  EXPECT_NO_THROW(check_metrics_file(empty, false, false));
  EXPECT_NO_THROW(check_metrics_file(d.file("absent.jsonl"), false, false));
  // Resume: a foreign line among the steps, or a torn last line that is not the start of a
  // step's object, is refused; the run's own file with a torn step line is not.
  const std::string steps = "{\"step\": 1}\n{\"step\": 2}\n";
  EXPECT_THROW(check_metrics_file(d.write("a.jsonl", steps + "x\n{\"step\": 3}\n"), true, false),
               ConfigError);
  EXPECT_THROW(check_metrics_file(d.write("b.jsonl", steps + "tail"), true, false), ConfigError);
  EXPECT_NO_THROW(
      check_metrics_file(d.write("c.jsonl", steps + "{\"step\": 3, \"lo"), true, false));
}

// Two runs naming one metrics file: the second is refused while the first writes it (its lines
// would mix with the first's), whether it is fresh or resumed; the file is left as the first
// writes it; once the first is done, the file is free again.
TEST(Metrics, ASecondWriterOfOneFileIsRefused) {
  TempDir d;
  const std::string p = d.file("m.jsonl");
  {
    MetricsWriter first(p, -1, false, "aaaa");
    StepMetrics m;
    m.step = 1;
    first.write(m);
    for (const int64_t resume_step : {int64_t(-1), int64_t(1)}) {
      try {
        MetricsWriter second(p, resume_step, /*overwrite=*/true, "aaaa");
        ADD_FAILURE() << "a second writer of one file was not refused";
      } catch (const ConfigError& e) {
        // The holder is named as /proc/locks tells it: this process.
        EXPECT_NE(std::string(e.what()).find(
                      fmt::format("is being written by another upipe run (pid {} (", ::getpid())),
                  std::string::npos)
            << e.what();
      }
    }
    m.step = 2;
    first.write(m);  // still its file: the lines go where the path leads
  }
  EXPECT_EQ(lines_of(p).size(), 2u);
  MetricsWriter resumed(p, 2, false, "aaaa");
  EXPECT_EQ(resumed.last_step_held(), 2);
}

// MFU's reference rate is measured inside the run's device budget, which the plan does not count
// it in: where 1024 x 1024 operands (12 MiB in fp32) do not fit, smaller ones are timed.
TEST(Metrics, GemmRateIsMeasuredWithinTheBudget) {
  Device dev({BackendKind::kCpu, int64_t(8) << 20, int64_t(1) << 20});
  int64_t n = 0;
  const double rate = measure_gemm_flops(dev, DType::kF32, 1024, 1, &n);
  EXPECT_EQ(n, 512);
  EXPECT_TRUE(std::isfinite(rate) && rate > 0) << rate;
  EXPECT_EQ(dev.mem().current(), 0) << "the operands are given back";
  Device tiny({BackendKind::kCpu, int64_t(16) << 10, int64_t(1) << 20});
  EXPECT_THROW(measure_gemm_flops(tiny, DType::kF32, 1024, 1), OutOfMemoryError);
}

TEST(Metrics, DurationsAndCounts) {
  EXPECT_EQ(format_duration(0), "0:00:00");
  EXPECT_EQ(format_duration(59.4), "0:00:59");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(360000), "100:00:00");
  EXPECT_EQ(format_duration(-1), "--:--:--");
  EXPECT_EQ(format_duration(INFINITY), "--:--:--");
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(1000), "1,000");
  EXPECT_EQ(format_count(1234567), "1,234,567");
  EXPECT_EQ(format_count(-1234), "-1,234");
}

TEST(Metrics, StepLine) {
  StepMetrics m = sample_metrics(12);
  EXPECT_EQ(format_step_line(m, 100),
            "step  12/100 | loss 5.4321 | gnorm 1.25e+00 | lr 3.00e-04 | 12,346 tok/s/rank | "
            "MFU 12.3% | peak 1.50 GiB (75% of 2.00 GiB) | 0.50 s/step | ETA 1:02:03");
  m.copy_loss = 0.5;
  m.budget_bytes = 0;
  const std::string s = format_step_line(m, 100);
  EXPECT_NE(s.find("loss 5.4321 | copy 0.5000 | gnorm"), std::string::npos) << s;
  EXPECT_EQ(s.find("% of"), std::string::npos) << s;
}

TEST(Metrics, ProgressBar) {
  EXPECT_EQ(format_progress_bar(0, 100, 10), "[----------]   0/100   0%");
  EXPECT_EQ(format_progress_bar(25, 100, 10), "[##--------]  25/100  25%");
  EXPECT_EQ(format_progress_bar(100, 100, 10), "[##########] 100/100 100%");
  EXPECT_EQ(format_progress_bar(150, 100, 4), "[####] 150/100 100%");
  EXPECT_EQ(format_progress_bar(1, 0, 4), "[----] 1/0   0%");
}

TEST(Metrics, ProgressModes) {
  EXPECT_EQ(parse_progress_mode("auto", true), ProgressMode::kBar);
  EXPECT_EQ(parse_progress_mode("auto", false), ProgressMode::kLines);
  EXPECT_EQ(parse_progress_mode("bar", false), ProgressMode::kBar);
  EXPECT_EQ(parse_progress_mode("lines", true), ProgressMode::kLines);
  EXPECT_THROW(parse_progress_mode("fancy", true), ConfigError);
}

// What `show` writes to a display of `total` steps logging every `interval`, in `mode`.
std::string displayed(int64_t total, int64_t interval, ProgressMode mode,
                      const std::function<void(ProgressDisplay&)>& show) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  {
    ProgressDisplay p(f, total, interval, mode);
    show(p);
  }
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

// Runs a display over steps 1..5 with log interval 2 and returns what it wrote.
std::string display_output(ProgressMode mode) {
  return displayed(5, 2, mode, [](ProgressDisplay& p) {
    for (int64_t s = 1; s <= 5; ++s) {
      p.update(sample_metrics(s));
      if (s == 3) p.print("checkpoint written: ckpt/step_3");
    }
    p.finish();
  });
}

TEST(Metrics, PlainLinesWhenNotATerminal) {
  const std::string out = display_output(ProgressMode::kLines);
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.find("\x1b"), std::string::npos);
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u);  // steps 2, 4, 5 (the last) and the message
  EXPECT_EQ(lines[0].rfind("step 2/5 |", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1], "checkpoint written: ckpt/step_3");
  EXPECT_EQ(lines[2].rfind("step 4/5 |", 0), 0u);
  EXPECT_EQ(lines[3].rfind("step 5/5 |", 0), 0u);
}

// A logged line's losses are the mean over the steps since the line before, and it says so.
TEST(Metrics, LoggedLossIsTheIntervalMean) {
  const std::string out = displayed(5, 2, ProgressMode::kLines, [](ProgressDisplay& p) {
    for (int64_t s = 1; s <= 5; ++s) {
      StepMetrics m = sample_metrics(s);
      m.loss = double(s);
      m.copy_loss = 10.0 * double(s);
      p.update(m);
    }
  });
  EXPECT_NE(out.find("step 2/5 | loss 1.5000 (mean of 2 steps) | copy 15.0000 |"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step 4/5 | loss 3.5000 (mean of 2 steps) | copy 35.0000 |"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step 5/5 | loss 5.0000 | copy 50.0000 |"), std::string::npos) << out;
}

// A validation measured between log lines is shown at its step; a run that stops between lines
// (a clean stop) shows its last steps in a final line.
TEST(Metrics, ValidationAndTheLastStepsAreAlwaysShown) {
  const std::string out = displayed(100, 10, ProgressMode::kLines, [](ProgressDisplay& p) {
    for (int64_t s = 1; s <= 17; ++s) {
      StepMetrics m = sample_metrics(s);
      if (s == 15) m.val_loss = 4.25;
      p.update(m);
    }
    p.finish();  // stopped after step 17 of 100
  });
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u) << out;
  EXPECT_NE(lines[0].find("step  10/100 | loss 5.4321 (mean of 10 steps)"), std::string::npos);
  EXPECT_NE(lines[1].find("step  15/100 | loss 5.4321 (mean of 5 steps) | val 4.2500"),
            std::string::npos)
      << lines[1];
  EXPECT_NE(lines[2].find("step  17/100 | loss 5.4321 (mean of 2 steps)"), std::string::npos)
      << lines[2];
}

TEST(Metrics, BarRedrawnInPlaceOnATerminal) {
  const std::string out = display_output(ProgressMode::kBar);
  // One redraw per step, each starting by clearing the line.
  size_t clears = 0;
  for (size_t i = out.find("\r\x1b[2K"); i != std::string::npos; i = out.find("\r\x1b[2K", i + 1))
    ++clears;
  EXPECT_EQ(clears, 6u);  // 5 steps + the message
  EXPECT_NE(out.find("[" + std::string(30, '#') + "] 5/5 100%"), std::string::npos);
  EXPECT_NE(out.find("\r\x1b[2Kcheckpoint written: ckpt/step_3\n[##"), std::string::npos);
  EXPECT_NE(out.find("step 4/5 |"), std::string::npos);
  EXPECT_EQ(out.find("step 3/5 |"), std::string::npos);  // not a log step
  EXPECT_EQ(out.back(), '\n');                           // finish() ends the bar line
}

TEST(Metrics, StartupTable) {
  StartupInfo s;
  s.model = "llama3-8b (preset)";
  s.parameters = 8030261248;
  s.dp = 2, s.cp = 4;
  s.method = "upipe";
  s.knobs = {{"head_chunk", "8"}};
  s.dtype = "bf16";
  s.budget_bytes = int64_t(80) << 30;
  s.seq_len = 1 << 20;
  s.micro_steps = 2;
  s.steps = 1000;
  s.data = "copy";
  s.isa = "avx512bf16";
  const std::string t = format_startup_table(s);
  EXPECT_NE(t.find("  model          llama3-8b (preset)\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  parameters     8.03 B (8,030,261,248)\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  ranks          8 = 2 DP x 4 CP\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  method         upipe (head_chunk 8)\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  dtype          bf16\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  cpu kernels    avx512bf16\n"), std::string::npos) << t;
  EXPECT_NE(t.find("1,048,576 tokens, 2 micro-step(s), 4,194,304 tokens per step"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("  memory budget  80.00 GiB per rank\n"), std::string::npos) << t;
  EXPECT_NE(t.find("  data           copy\n"), std::string::npos) << t;
}

}  // namespace
}  // namespace upipe
