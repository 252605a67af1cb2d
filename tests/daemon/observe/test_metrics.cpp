// Metrics JSON lines: every field of docs/architecture.md present, escaping, NaN -> null, one flushed line
// per record, and a line that Python's json module reads back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>

#include "common/errors.hpp"
#include "daemon/observe/metrics.hpp"
#include "tests/daemon/test_util.hpp"

namespace thetad::daemon {
namespace {

// A tiny structural JSON check: brackets balance outside strings, strings terminate, and no
// bare NaN/Infinity tokens slipped through.
bool balanced_json(const std::string& s) {
  std::vector<char> stack;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      else if (static_cast<unsigned char>(c) < 0x20) return false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') stack.push_back(c);
    else if (c == '}' || c == ']') {
      if (stack.empty() || stack.back() != (c == '}' ? '{' : '[')) return false;
      stack.pop_back();
    } else if (c == 'N' || c == 'I') return false;
  }
  return stack.empty() && !in_string;
}

StepRecord sample() {
  StepRecord r;
  r.step = 17;
  r.rank = 1;
  r.loss = 0.25;
  r.task_loss = {{3, 0.5}, {4, 0.0}};
  r.lr = 1e-3;
  r.samples = 64;
  r.step_ms = 12.5;
  r.forward_ms = 3;
  r.backward_ms = 5;
  r.comm_wait_ms = 1.5;
  r.optimizer_ms = 2;
  r.count_exchange_ms = 0.007;
  r.bytes_allreduced = 1 << 20;
  r.bytes_pruned = int64_t{3} << 30;
  r.buckets_launched = 4;
  r.buckets_pruned = 12;
  r.buckets_broadcast = 2;
  r.store.h2d_bytes = 100;
  r.store.d2h_bytes = 200;
  r.store.swap_hits = 5;
  r.store.swap_misses = 1;
  r.device_mem_peak_bytes = int64_t{9} << 30;
  r.store.host_pinned_bytes = int64_t{2} << 30;
  return r;
}

const char* kKeys[] = {"step", "rank", "loss", "task_loss", "lr", "samples", "step_ms", "forward_ms",
                       "backward_ms", "comm_wait_ms", "optimizer_ms", "count_exchange_ms",
                       "bytes_allreduced", "bytes_pruned", "buckets_launched", "buckets_pruned", "buckets_broadcast",
                       "buckets_kept", "bytes_kept", "bytes_state_moved", "state_moves", "allreduce_algbw_gbs",
                       "allreduce_busbw_gbs", "broadcast_algbw_gbs", "comm_busy_ms",
                       "grad_stream_peak_bytes",
                       "h2d_bytes", "d2h_bytes", "swap_hits", "swap_misses",
                       "device_mem_peak_bytes", "host_pinned_bytes", "cpu_adam_ms",
                       "acquire_wait_ms", "cache_loads", "cache_flushes", "device_steps", "streamed_steps", "act_offload_bytes", "act_device_peak_bytes", "act_layer_bytes",
                       "act_pool_allocations", "theta_h2d_bytes", "theta_d2h_bytes", "theta_device_slot_bytes",
                       "theta_device_steps", "theta_cpu_adam_ms", "mem_params_bytes", "mem_grads_bytes",
                       "mem_optimizer_bytes", "mem_lines_bytes", "mem_activations_bytes", "mem_other_bytes",
                       "mem_step_peak_bytes", "nonfinite", "skipped", "kind", "time", "samples_per_s",
                       "tokens_per_s", "grad_norm", "grad_norm_task"};

TEST(Metrics, RecordHasEveryField) {
  const std::string j = to_json(sample());
  EXPECT_TRUE(balanced_json(j)) << j;
  for (const char* k : kKeys) EXPECT_NE(j.find(std::string("\"") + k + "\":"), std::string::npos) << k;
  EXPECT_NE(j.find("\"task_loss\":[{\"task\":3,\"loss\":0.5},{\"task\":4,\"loss\":0}]"), std::string::npos) << j;
  EXPECT_NE(j.find("\"bytes_pruned\":3221225472"), std::string::npos) << j;
  EXPECT_EQ(j.front(), '{');
  EXPECT_EQ(j.back(), '}');
}

TEST(Metrics, NonFiniteBecomesNull) {
  StepRecord r = sample();
  r.loss = std::numeric_limits<double>::quiet_NaN();
  r.task_loss = {{0, std::numeric_limits<double>::infinity()}};
  r.lr = -std::numeric_limits<double>::infinity();
  const std::string j = to_json(r);
  EXPECT_TRUE(balanced_json(j)) << j;
  EXPECT_NE(j.find("\"loss\":null"), std::string::npos) << j;
  EXPECT_NE(j.find("{\"task\":0,\"loss\":null}"), std::string::npos) << j;
  EXPECT_NE(j.find("\"lr\":null"), std::string::npos) << j;
}

TEST(Metrics, StringEscaper) {
  EXPECT_EQ(json_string("plain"), "\"plain\"");
  EXPECT_EQ(json_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(json_string("l1\nl2\t\r\b\f"), "\"l1\\nl2\\t\\r\\b\\f\"");
  EXPECT_EQ(json_string(std::string("\x01\x1f\x7f", 3)), "\"\\u0001\\u001f\\u007f\"");
  EXPECT_EQ(json_string(std::string("nul\0x", 5)), "\"nul\\u0000x\"");
  EXPECT_EQ(json_string("Θ ünïcode"), "\"Θ ünïcode\"");  // UTF-8 passes through
  std::string n;
  append_json_number(n, 0.1);
  EXPECT_DOUBLE_EQ(std::stod(n), 0.1);  // round-trips
}

TEST(Metrics, WriterCreatesDirsAndWritesLines) {
  test::ScratchDir dir;
  const std::string path = dir.file("runs/job/metrics.jsonl");
  {
    MetricsWriter w(path);
    StepRecord r = sample();
    w.write(r);
    // Flushed per record: visible before the writer is gone.
    EXPECT_EQ(test::read_file(path), to_json(r) + "\n");
    r.step = 18;
    r.loss = std::nan("");
    w.write(r);
  }
  const std::string text = test::read_file(path);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  {
    MetricsWriter w(path, /*resume_step=*/19);  // resumed after both: both kept
    w.write(sample());
  }
  const std::string text3 = test::read_file(path);
  EXPECT_EQ(std::count(text3.begin(), text3.end(), '\n'), 3);
  if (test::have_python()) {
    EXPECT_TRUE(test::python_ok(
        "import json,sys\n"
        "recs=[json.loads(l) for l in open(sys.argv[1])]\n"
        "assert len(recs)==3 and recs[1][\"step\"]==18 and recs[1][\"loss\"] is None\n"
        "assert recs[0][\"task_loss\"][0]==dict(task=3,loss=0.5)\n"
        "assert len(recs[0])==" + std::to_string(std::size(kKeys)) + ", len(recs[0])",
        path));
  }
}

// A run that crashed after its last checkpoint wrote records that the resumed run replays: the
// resumed writer drops them (and a torn last line), so each step has one record.
TEST(Metrics, ResumedWriterDropsReplayedSteps) {
  test::ScratchDir dir;
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsWriter w(path);
    for (int step = 0; step < 6; ++step) {
      StepRecord r = sample();
      r.step = step;
      w.write(r);
    }
  }
  { std::ofstream(path, std::ios::app) << "{\"step\":6,\"rank\":0,\"lo"; }  // killed mid-line
  {
    MetricsWriter w(path, /*resume_step=*/4);
    for (int step = 4; step < 8; ++step) {
      StepRecord r = sample();
      r.step = step;
      w.write(r);
    }
  }
  std::istringstream in(test::read_file(path));
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) steps.push_back(step_of_record(line));
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(step_of_record("{\"step\":12,\"rank\":0}"), 12);
  EXPECT_EQ(step_of_record("{\"step\":12"), -1);
  EXPECT_EQ(step_of_record("garbage"), -1);
}

// The record's time stamp, throughput and gradient norms; a step record says its kind.
TEST(Metrics, RecordHasTimeRatesAndNorms) {
  StepRecord r = sample();
  r.time = utc_time_now();
  r.samples_per_s = 512;
  r.grad_norm = 2.5;
  r.grad_norm_task = {{3, 1.5}, {4, 2.0}};
  const std::string j = to_json(r);
  EXPECT_TRUE(balanced_json(j)) << j;
  const std::string head = "{\"step\":17,\"rank\":1,\"kind\":\"train\",\"time\":";
  EXPECT_EQ(j.compare(0, head.size(), head), 0) << j;
  EXPECT_NE(j.find("\"tokens_per_s\":null"), std::string::npos) << j;  // not a token model
  EXPECT_NE(j.find("\"grad_norm\":2.5,\"grad_norm_task\":[{\"task\":3,\"norm\":1.5},{\"task\":4,\"norm\":2}]"),
            std::string::npos) << j;
  // ISO 8601 in UTC with milliseconds: 2025-03-01T12:00:00.250Z
  ASSERT_EQ(r.time.size(), 24u) << r.time;
  EXPECT_EQ(r.time[4], '-');
  EXPECT_EQ(r.time[10], 'T');
  EXPECT_EQ(r.time[19], '.');
  EXPECT_EQ(r.time.back(), 'Z');
  EXPECT_NE(j.find("\"time\":\"" + r.time + "\""), std::string::npos) << j;
}

// An evaluation's record: a kind of its own, losses and counts keyed by task, null for none.
TEST(Metrics, EvalRecord) {
  EvalRecord e;
  e.step = 40;
  e.time = "2025-03-01T12:00:00.250Z";
  e.eval_loss = {{0, 2.5}, {7, std::nan("")}};
  e.eval_tokens = {96, 0};
  e.eval_ms = 1.5;
  const std::string j = to_json(e);
  EXPECT_EQ(j, "{\"step\":40,\"kind\":\"eval\",\"time\":\"2025-03-01T12:00:00.250Z\",\"eval_loss\":{\"0\":2.5,\"7\":null},"
               "\"eval_tokens\":{\"0\":96,\"7\":0},\"eval_ms\":1.5}");
  bool eval = false;
  EXPECT_EQ(step_of_record(j, &eval), 40);
  EXPECT_TRUE(eval);
  EXPECT_EQ(step_of_record(to_json(sample()), &eval), 17);
  EXPECT_FALSE(eval);
}

// A resumed run keeps the step records before its step and the evaluations up to it (the
// evaluation after N steps precedes checkpoint N): each in its order, none twice.
TEST(Metrics, ResumeKeepsEvaluationsUpToItsStep) {
  test::ScratchDir dir;
  const std::string path = dir.file("metrics.jsonl");
  const auto eval_at = [](int64_t step) {
    EvalRecord e;
    e.step = step;
    e.eval_loss = {{0, 1.0}};
    e.eval_tokens = {8};
    return e;
  };
  {
    MetricsWriter w(path);
    for (int step = 0; step < 6; ++step) {
      StepRecord r = sample();
      r.step = step;
      w.write(r);
      if (step % 2 == 1) w.write(eval_at(step + 1));  // after 2, 4 and 6 steps
    }
  }
  { MetricsWriter w(path, /*resume_step=*/4); }
  std::istringstream in(test::read_file(path));
  std::vector<std::string> kept;
  for (std::string line; std::getline(in, line);) {
    bool eval = false;
    const int64_t step = step_of_record(line, &eval);
    kept.push_back((eval ? "e" : "s") + std::to_string(step));
  }
  EXPECT_EQ(kept, (std::vector<std::string>{"s0", "s1", "e2", "s2", "s3", "e4"}));
}

// A fresh run never overwrites an earlier run's records: they are moved aside to a suffixed name
// beside it, with the job that wrote them; the new run's job is written beside the new file.
TEST(Metrics, FreshRunMovesTheEarlierFileAside) {
  test::ScratchDir dir;
  const std::string path = dir.file("runs/metrics.jsonl");
  {
    MetricsWriter w(path, 0, "job: first\n");
    w.write(sample());
    EXPECT_EQ(w.moved_aside(), "");  // nothing there before
  }
  EXPECT_EQ(test::read_file(path + ".job.yaml"), "job: first\n");
  std::string aside;
  {
    MetricsWriter w(path, 0, "job: second\n");
    aside = w.moved_aside();
  }
  ASSERT_NE(aside, "");
  const std::string name = std::filesystem::path(aside).filename().string();
  EXPECT_EQ(name.compare(0, 17, "metrics.previous-"), 0) << name;
  EXPECT_EQ(name.substr(name.size() - 6), ".jsonl") << name;  // STEM.previous-<UTC>EXT
  EXPECT_EQ(std::filesystem::path(aside).parent_path(), std::filesystem::path(path).parent_path());
  EXPECT_EQ(test::read_file(aside), to_json(sample()) + "\n");
  EXPECT_EQ(test::read_file(aside + ".job.yaml"), "job: first\n");
  EXPECT_EQ(test::read_file(path), "");
  EXPECT_EQ(test::read_file(path + ".job.yaml"), "job: second\n");
  {
    MetricsWriter w(path, 0);  // an empty file is not kept
    EXPECT_EQ(w.moved_aside(), "");
  }
}

TEST(Metrics, WriterErrorsNameThePath) {
  test::ScratchDir dir;
  const std::string blocker = dir.file("file");
  { std::ofstream(blocker) << "x"; }
  try {
    MetricsWriter w(blocker + "/sub/metrics.jsonl");  // parent is a regular file
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(blocker), std::string::npos) << e.what();
  }
}

// bench/plot_metrics.py turns a file this writer produced into the three PNGs.
TEST(Metrics, PlotScriptReadsWriterOutput) {
  if (!test::have_python() || std::system("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with matplotlib not available";
  test::ScratchDir dir;
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsWriter w(path);
    for (int step = 0; step < 20; ++step) {
      for (int rank = 0; rank < 2; ++rank) {
        StepRecord r = sample();
        r.step = step;
        r.rank = rank;
        r.task_loss = {{(step * 2 + rank) % 5, 1.0 / (step + 1)}};
        r.loss = step == 3 ? std::nan("") : 1.0 / (step + 1);  // a NaN step must not break plots
        w.write(r);
      }
    }
  }
  const std::string out = dir.file("plots");
  const std::string cmd = std::string("/usr/bin/python3 ") + THETAD_SOURCE_DIR + "/bench/plot_metrics.py '" +
                          path + "' -o '" + out + "' > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  for (const char* png : {"loss_per_task.png", "step_time.png", "bytes.png"})
    EXPECT_GT(std::filesystem::file_size(out + "/" + png), 1000u) << png;
}

// Bad input is exit 2 with one line, no traceback; a run without one finite loss says so.
TEST(Metrics, PlotScriptRefusesMissingFileAndNotesAllNan) {
  if (!test::have_python() || std::system("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null") != 0)
    GTEST_SKIP() << "/usr/bin/python3 with matplotlib not available";
  test::ScratchDir dir;
  const std::string script = std::string("/usr/bin/python3 ") + THETAD_SOURCE_DIR + "/bench/plot_metrics.py '";
  const std::string log = dir.file("out.txt");
  const std::string missing = script + dir.file("none.jsonl") + "' > '" + log + "' 2>&1";
  const int rc = std::system(missing.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << rc;
  std::string text = test::read_file(log);
  EXPECT_NE(text.find("none.jsonl: cannot read the metrics file"), std::string::npos) << text;
  EXPECT_EQ(text.find("Traceback"), std::string::npos) << text;
  const std::string path = dir.file("nan.jsonl");
  {
    MetricsWriter w(path);
    for (int step = 0; step < 3; ++step) {
      StepRecord r = sample();
      r.step = step;
      r.loss = std::nan("");
      r.task_loss = {{0, std::nan("")}};
      w.write(r);
    }
  }
  const std::string all_nan = script + path + "' -o '" + dir.file("plots") + "' > '" + log + "' 2>&1";
  ASSERT_EQ(std::system(all_nan.c_str()), 0) << test::read_file(log);
  text = test::read_file(log);
  EXPECT_NE(text.find("note: no finite loss in 3 records"), std::string::npos) << text;
}

}  // namespace
}  // namespace thetad::daemon
