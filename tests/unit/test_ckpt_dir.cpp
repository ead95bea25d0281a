// The checkpoint directory protocol and the storage checks alone (no MPI, no HDF5): names,
// ordering, `latest`, commit's rename and pruning, a failed commit, the cleanup of dead saves' temp
// files; the run dir's lock, the probe file and the space a run needs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/check.h"
#include "ckpt/dir.h"
#include "storage/checks.h"

using namespace zero3d;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "zero3d_ckpt_dir_XXXXXX").string();
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
  void touch(const std::string& name, const std::string& text = "x") const { std::ofstream(path + "/" + name) << text; }
};
std::string error_of(const std::string& dir_or_file) {
  try {
    checkpoint_file(dir_or_file);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(CkptDir, NamesAndOrder) {
  EXPECT_EQ(step_of("a/b/step_00000020.h5"), 20);
  EXPECT_EQ(step_of("step_7.h5"), 7);
  EXPECT_EQ(step_of("step_00000020.h5.tmp"), -1);
  EXPECT_EQ(step_of("step_.h5"), -1);
  EXPECT_EQ(step_of("step_12a.h5"), -1);
  EXPECT_EQ(step_of("latest"), -1);
  TempDir d;
  for (const char* n : {"step_00000010.h5", "step_00000200.h5", "step_00000030.h5", "step_00000040.h5.tmp", "notes"})
    d.touch(n);
  fs::create_directory(d.path + "/step_00000500.h5");  // a directory is no checkpoint
  const auto all = list_checkpoints(d.path);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(fs::path(all[0]).filename(), "step_00000200.h5");
  EXPECT_EQ(fs::path(all[2]).filename(), "step_00000010.h5");
  EXPECT_TRUE(list_checkpoints(d.path + "/none").empty());
}

TEST(CkptDir, CommitPublishesPrunesAndCleans) {
  TempDir d;
  EXPECT_THAT(error_of(d.path), ::testing::HasSubstr("has no 'latest' file"));
  EXPECT_THAT(error_of(d.path + "/none"), ::testing::HasSubstr("does not exist"));
  for (int step : {10, 20, 30}) {
    const std::string final_path = d.path + "/step_000000" + std::to_string(step) + ".h5";
    d.touch(fs::path(final_path).filename().string() + ".tmp", "data " + std::to_string(step));
    if (step == 30) d.touch("step_00000025.h5.tmp", "a save that died");
    EXPECT_EQ(commit_checkpoint(d.path, final_path + ".tmp", final_path, /*keep_last=*/2), "");
    EXPECT_EQ(read_latest(d.path), fs::path(final_path).filename().string());
    EXPECT_EQ(checkpoint_file(d.path), final_path);
    EXPECT_FALSE(fs::exists(final_path + ".tmp"));
  }
  const auto all = list_checkpoints(d.path);
  ASSERT_EQ(all.size(), 2u);  // keep_last 2: step 10 pruned
  EXPECT_EQ(fs::path(all[1]).filename(), "step_00000020.h5");
  EXPECT_FALSE(fs::exists(d.path + "/step_00000025.h5.tmp"));
  EXPECT_FALSE(fs::exists(d.path + "/latest.tmp"));
  std::ifstream f(d.path + "/step_00000030.h5");
  std::string text;
  std::getline(f, text);
  EXPECT_EQ(text, "data 30");
  EXPECT_EQ(checkpoint_file(d.path + "/step_00000020.h5"), d.path + "/step_00000020.h5");
}

TEST(CkptDir, FailedCommitLeavesLatest) {
  TempDir d;
  d.touch("step_00000010.h5.tmp", "data 10");
  ASSERT_EQ(commit_checkpoint(d.path, d.path + "/step_00000010.h5.tmp", d.path + "/step_00000010.h5", 0), "");
  // A save whose file never appeared (the writer failed before creating it): an error, nothing moves.
  const std::string e = commit_checkpoint(d.path, d.path + "/step_00000020.h5.tmp", d.path + "/step_00000020.h5", 0);
  EXPECT_THAT(e, ::testing::HasSubstr("step_00000020.h5.tmp"));
  EXPECT_EQ(read_latest(d.path), "step_00000010.h5");
  EXPECT_FALSE(fs::exists(d.path + "/step_00000020.h5"));
}

TEST(Storage, DirLockRefusesASecondHolderAndTakesOverADeadOne) {
  TempDir d;
  std::string warning;
  {
    DirLock first(d.path, "run directory", "another --run-dir", warning);
    EXPECT_EQ(warning, "");
    // flock is per open file description: a second open in this process conflicts like another run.
    try {
      DirLock second(d.path, "run directory", "another --run-dir", warning);
      ADD_FAILURE() << "a second lock on the same run dir was granted";
    } catch (const UserError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("is in use by another zero3d run (host "));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("pid " + std::to_string(getpid())));
    }
  }
  EXPECT_FALSE(fs::exists(d.path + "/.lock"));  // released and removed
  d.touch(".lock", "host gone pid 1 since 2026-01-01T00:00:00\n");  // a run that died: no flock held
  {
    DirLock again(d.path, "run directory", "another --run-dir", warning);
    EXPECT_THAT(warning, ::testing::HasSubstr("was locked by a run that is gone (host gone pid 1"));
  }
  EXPECT_FALSE(fs::exists(d.path + "/.lock"));
}

TEST(Storage, ProbeAndSpace) {
  TempDir d;
  EXPECT_EQ(probe_writable(d.path, 3), "");
  EXPECT_TRUE(fs::is_empty(d.path));  // the probe file is gone
  EXPECT_THAT(probe_writable(d.path + "/none", 0), ::testing::HasSubstr("No such file or directory"));
  EXPECT_GT(free_bytes(d.path), 0);
  EXPECT_EQ(free_bytes(d.path + "/none"), -1);
  // keep_last 0: every save stays; keep_last 2 from empty: two kept plus one being written;
  // already two there: one more at a time; fewer saves than that: only those.
  EXPECT_EQ(checkpoint_space_needed(10, 5, 0, 0), 50u);
  EXPECT_EQ(checkpoint_space_needed(10, 5, 2, 0), 30u);
  EXPECT_EQ(checkpoint_space_needed(10, 5, 2, 2), 10u);
  EXPECT_EQ(checkpoint_space_needed(10, 5, 2, 7), 10u);
  EXPECT_EQ(checkpoint_space_needed(10, 1, 3, 0), 10u);
  EXPECT_EQ(checkpoint_space_needed(10, 0, 3, 0), 0u);
}
