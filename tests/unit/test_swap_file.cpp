// storage/swap_file.h (and core/posix_io.h's AppendFile, at the end): transfers split over blocks and threads come back bit for bit, aligned (O_DIRECT)
// or not; a file that cannot be made, or that shrinks under the run, is an IoError naming it; a
// killed run's files are removed and a live one's are not; the checksum sees a changed byte; a sizing
// file (zero3d plan's) makes nothing and touches no buffer, and counts its transfers.
#include "storage/swap_file.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "core/host_buffer.h"
#include "core/posix_io.h"

using namespace zero3d;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/zero3d_swap_XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST(SwapFile, ReadsBackWhatItWroteAlignedOrNot) {
  TempDir dir;
  const size_t bytes = 3 << 20;
  SwapFile f(dir.path + "/a.swap", bytes, {64 << 10, 3});  // 64 KiB blocks, 3 threads
  HostBuffer out(bytes), in(bytes);                        // page-aligned: O_DIRECT where supported
  for (size_t i = 0; i < bytes; ++i) out.data()[i] = static_cast<char>(i * 7 + (i >> 12));
  f.wait(f.write(0, out.data(), bytes));
  f.wait(f.read(0, in.data(), bytes));
  EXPECT_EQ(std::memcmp(in.data(), out.data(), bytes), 0);
  // Unaligned offsets, lengths and addresses go through the page cache; several in flight at once.
  std::vector<char> part(100003);
  std::iota(part.begin(), part.end(), 'a');
  const auto w1 = f.write(12345, part.data(), part.size()), w2 = f.write(2000001, part.data(), 777);
  f.wait(w1);
  f.wait(w2);
  std::vector<char> back(part.size());
  f.wait(f.read(12345, back.data(), back.size()));
  EXPECT_EQ(back, part);
  f.wait(f.read(0, in.data(), bytes));  // the aligned read sees the unaligned writes
  EXPECT_EQ(std::memcmp(in.data() + 12345, part.data(), part.size()), 0);
  EXPECT_EQ(std::memcmp(in.data(), out.data(), 12345), 0);
  f.wait(0);  // a ticket waited for before (or never issued) returns at once
  const SwapFile::Stats s = f.take_stats();
  EXPECT_EQ(s.bytes_written, bytes + part.size() + 777);
  EXPECT_EQ(s.bytes_read, 2 * bytes + part.size());
}

TEST(SwapFile, ASizingFileCountsAndTouchesNothing) {
  TempDir dir;
  const std::string path = dir.path + "/sub/a.swap";  // its directory does not exist: nothing is made there
  SwapFile::Stats st;
  {
    SwapFile f(path, 5 << 20, {1 << 20, 2, true});
    EXPECT_TRUE(f.sizing());
    // Buffers nobody may touch: a transfer that read or wrote them would fault.
    void* none = mmap(nullptr, 5 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(none, MAP_FAILED);
    f.wait(f.write(0, none, 5 << 20));
    f.wait(f.read(4096, none, 3 << 20));
    f.wait(f.read(0, none, 1000));
    f.wait_all();
    st = f.take_stats();
    munmap(none, 5 << 20);
  }
  EXPECT_EQ(st.bytes_written, 5u << 20);
  EXPECT_EQ(st.bytes_read, (3u << 20) + 1000);
  EXPECT_FALSE(fs::exists(dir.path + "/sub"));
}

TEST(SwapFile, PreallocatedUnwrittenRangesReadAsZeros) {
  TempDir dir;
  SwapFile f(dir.path + "/z.swap", 1 << 20, {});
  EXPECT_GE(fs::file_size(dir.path + "/z.swap"), 1u << 20);
  std::vector<char> in(1 << 20, 1);
  f.wait(f.read(0, in.data(), in.size()));
  EXPECT_EQ(std::count(in.begin(), in.end(), 0), static_cast<long>(in.size()));
}

TEST(SwapFile, FailuresNameTheFile) {
  TempDir dir;
  EXPECT_THROW(
      {
        try {
          SwapFile f(dir.path + "/absent/x.swap", 4096, {});
        } catch (const IoError& e) {
          EXPECT_THAT(e.what(), HasSubstr("cannot create swap file '" + dir.path + "/absent/x.swap': No such file"));
          throw;
        }
      },
      IoError);
  // A file truncated under the run: the read makes no progress, is retried, then fails.
  SwapFile f(dir.path + "/t.swap", 1 << 20, {});
  ASSERT_EQ(::truncate((dir.path + "/t.swap").c_str(), 4096), 0);
  std::vector<char> in(8192);
  const auto t = f.read(4096, in.data(), in.size());
  try {
    f.wait(t);
    FAIL() << "a read past the end succeeded";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("swap file '" + dir.path + "/t.swap': read of 8192 bytes at offset 4096 failed "
                                    "after 4 tries: end of file"));
  }
}

TEST(SwapFile, DeadRunsFilesAreRemovedLiveOnesKept) {
  TempDir dir;
  const std::string run = swap_dir(dir.path, "/some/run");
  EXPECT_EQ(run.rfind(dir.path + "/zero3d-", 0), 0u);
  EXPECT_EQ(run, swap_dir(dir.path, "/some/run"));  // the same run, the same directory
  EXPECT_NE(run, swap_dir(dir.path, "/other/run"));
  fs::create_directories(run);
  std::ofstream(run + "/rank0.123.optimizer") << std::string(5000, 'x');  // a killed run's: no lock held
  fs::create_directories(dir.path + "/unrelated");
  std::ofstream(dir.path + "/unrelated/keep") << "x";
  uint64_t bytes = 0;
  {
    SwapFile live(run + "/rank1.456.optimizer", 8192, {});
    EXPECT_EQ(remove_dead_swap_files(dir.path, &bytes), 1);
    EXPECT_EQ(bytes, 5000u);
    EXPECT_TRUE(fs::exists(run + "/rank1.456.optimizer"));  // held by a live process (this one)
    EXPECT_FALSE(fs::exists(run + "/rank0.123.optimizer"));
  }
  EXPECT_FALSE(fs::exists(run));  // the last file out removed the directory
  EXPECT_TRUE(fs::exists(dir.path + "/unrelated/keep"));  // only zero3d-* directories are looked at
}

TEST(SwapFile, ChecksumSeesEveryByte) {
  std::vector<uint64_t> a(1000);
  std::iota(a.begin(), a.end(), 1);
  const uint64_t h = swap_checksum(a.data(), a.size() * 8);
  EXPECT_EQ(h, swap_checksum(a.data(), a.size() * 8));
  for (size_t i : {size_t(0), size_t(3), size_t(997), size_t(999)}) {
    auto b = a;
    b[i] ^= uint64_t(1) << 40;
    EXPECT_NE(swap_checksum(b.data(), b.size() * 8), h) << i;
  }
  std::vector<uint64_t> zeros(512, 0);
  EXPECT_NE(swap_checksum(zeros.data(), 4096), swap_checksum(zeros.data(), 2048));  // the length counts
}

// core/posix_io.h's AppendFile (metrics.jsonl, csv_monitor's files): a line that fails halfway
// (here the file-size limit, as a full disk would) is cut back out, so the file holds whole lines
// a resumed run reads back; the next line lands after the last whole one; a reopened file appends.
TEST(AppendFile, AFailedAppendLeavesNoPartialLine) {
  TempDir dir;
  const std::string path = dir.path + "/lines.txt";
  AppendFile f;
  ASSERT_EQ(f.open(path), "");
  EXPECT_EQ(f.append("first line\n"), "");
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 16;  // 5 bytes of the next line fit, then EFBIG
  const auto handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string failed = f.append("a second line, past the limit\n");
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, handler);
  EXPECT_THAT(failed, HasSubstr("too large"));
  EXPECT_EQ(f.size(), 11u);
  EXPECT_EQ(read_text_file(path, "lines"), "first line\n");
  EXPECT_EQ(f.append("third\n"), "");
  EXPECT_EQ(read_text_file(path, "lines"), "first line\nthird\n");
  AppendFile again;
  ASSERT_EQ(again.open(path), "");
  EXPECT_EQ(again.size(), 17u);
}

// The same through libfiu (the suite's fault library; ctest's AppendFile.under_libfiu runs this test
// under its POSIX preload, where it arms the failure itself): the next pwrite fails with ENOSPC.
// The line is dropped whole, the error is the system's own text, and the next line lands. Outside
// the preload it skips, unless ZERO3D_EXPECT_FIU says it should have been there.
TEST(AppendFile, AWriteLibfiuFailsNamesTheSystemsError) {
  using Enable = int (*)(const char* name, int failnum, void* failinfo, unsigned flags);
  const auto enable = reinterpret_cast<Enable>(dlsym(RTLD_DEFAULT, "fiu_enable"));
  if (!enable) {
    if (std::getenv("ZERO3D_EXPECT_FIU")) FAIL() << "libfiu's POSIX preload is not loaded (LD_PRELOAD)";
    GTEST_SKIP() << "not under libfiu's POSIX preload (ctest's AppendFile.under_libfiu runs it there)";
  }
  TempDir dir;
  const std::string path = dir.path + "/lines.txt";
  AppendFile f;
  ASSERT_EQ(f.open(path), "");
  EXPECT_EQ(f.append("first\n"), "");
  ASSERT_EQ(enable("posix/io/rw/pwrite", 1, reinterpret_cast<void*>(intptr_t{ENOSPC}), 1 /* FIU_ONETIME */), 0);
  EXPECT_EQ(f.append("second\n"), std::strerror(ENOSPC));
  EXPECT_EQ(read_text_file(path, "lines"), "first\n");
  EXPECT_EQ(f.append("third\n"), "");
  EXPECT_EQ(read_text_file(path, "lines"), "first\nthird\n");
  AppendFile none;
  EXPECT_EQ(none.open(dir.path + "/no/such/dir/lines.txt"), std::strerror(ENOENT));
}
