// The tuning cache on disk: reading and writing files, merging entries, and writers
// running at once (threads and processes) that leave a whole file with every entry.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "api/tune_format.h"
#include "tune_test_util.h"

namespace fa3::test {
namespace {

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::vector<TuneEntry> read_ok(const std::string& path) {
  std::vector<TuneEntry> entries;
  const Status s = read_tune_cache(path, test_key(), &entries);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return entries;
}

TEST(TuneStore, MissingFileHoldsNoEntries) {
  ScratchDir dir;
  std::vector<TuneEntry> entries = {test_entry(2)};
  ASSERT_TRUE(read_tune_cache(dir.file("none.txt"), test_key(), &entries).is_ok());
  EXPECT_TRUE(entries.empty());
}

TEST(TuneStore, WriteCreatesTheDirectoryAndReadsBack) {
  ScratchDir dir;
  const std::string path = dir.file("a/b/cache.txt");
  const std::vector<TuneEntry> entries = {test_entry(512), test_entry(4096)};
  ASSERT_TRUE(write_tune_cache(path, test_key(), entries).is_ok());
  EXPECT_TRUE(same_entries(read_ok(path), entries));
  // Only the cache and its lock file: the temporary file was renamed.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("a/b"))) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"cache.txt", "cache.txt.lock"}));
}

TEST(TuneStore, EntriesMergeByClassInAStableOrder) {
  ScratchDir dir;
  const std::string path = dir.file("cache.txt");
  ASSERT_TRUE(write_tune_cache(path, test_key(), {test_entry(4096), test_entry(512)}).is_ok());
  ASSERT_TRUE(write_tune_cache(path, test_key(), {test_entry(1024), test_entry(512, "128x128")}).is_ok());
  EXPECT_TRUE(same_entries(read_ok(path), {test_entry(512, "128x128"), test_entry(1024), test_entry(4096)}));
  // Of two entries of one class in one call, the later stays.
  ASSERT_TRUE(write_tune_cache(path, test_key(), {test_entry(1024, "x1"), test_entry(1024, "x2")}).is_ok());
  EXPECT_EQ(read_ok(path)[1].kernel, "x2");
}

TEST(TuneStore, AFileFa3RefusesIsReplaced) {
  ScratchDir dir;
  const std::string path = dir.file("cache.txt");
  write_text(path, "garbage\n");
  std::vector<TuneEntry> entries;
  EXPECT_FALSE(read_tune_cache(path, test_key(), &entries).is_ok());
  ASSERT_TRUE(write_tune_cache(path, test_key(), {test_entry(64)}).is_ok());
  EXPECT_TRUE(same_entries(read_ok(path), {test_entry(64)}));

  TuneKey other = test_key();
  other.gpu_name = "NVIDIA H100";
  ASSERT_TRUE(write_tune_cache(path, other, {test_entry(128)}).is_ok());
  entries = {test_entry(2)};
  EXPECT_FALSE(read_tune_cache(path, test_key(), &entries).is_ok()) << "the file now belongs to the other key";
  EXPECT_EQ(entries.size(), 1u) << "left as it was";
}

TEST(TuneStore, ReadErrorsNameTheFile) {
  ScratchDir dir;
  const std::string path = dir.file("cache.txt");
  write_text(path, format_tune_cache(test_key(), {test_entry(64)}).substr(0, 40));
  std::vector<TuneEntry> entries;
  const Status s = read_tune_cache(path, test_key(), &entries);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("'" + path + "': truncated", 0), 0u) << s.message();

  const Status is_dir = read_tune_cache(dir.path(), test_key(), &entries);
  EXPECT_EQ(is_dir.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(is_dir.message().find("path: cannot read '" + dir.path() + "'"), std::string::npos) << is_dir.message();
}

TEST(TuneStore, OversizedFilesAreNotRead) {
  ScratchDir dir;
  const std::string path = dir.file("cache.txt");
  write_text(path, std::string(5 << 20, '#'));
  std::vector<TuneEntry> entries;
  const Status s = read_tune_cache(path, test_key(), &entries);
  EXPECT_NE(s.message().find("larger than 4 MiB, which no tuning cache is"), std::string::npos) << s.message();
}

TEST(TuneStore, WriteRefusesBadPathsAndContents) {
  ScratchDir dir;
  Status s = write_tune_cache("", test_key(), {test_entry(64)});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("path: empty"), std::string::npos) << s.message();

  // A directory that cannot be made: a plain file stands where it would go.
  write_text(dir.file("file"), "x");
  s = write_tune_cache(dir.file("file/sub/cache.txt"), test_key(), {test_entry(64)});
  EXPECT_NE(s.message().find("path: cannot create the directory '" + dir.file("file/sub") + "'"), std::string::npos)
      << s.message();

  TuneEntry bad = test_entry(64);
  bad.kernel_ms = 0;
  s = write_tune_cache(dir.file("cache.txt"), test_key(), {test_entry(32), bad});
  EXPECT_EQ(s.message(), "entries[1].kernel_ms: must be finite and > 0, got 0");
  EXPECT_FALSE(std::filesystem::exists(dir.file("cache.txt"))) << "nothing written";
}

TEST(TuneStore, UnwritableDirectoryLeavesTheCacheAsItWas) {
  if (geteuid() == 0) GTEST_SKIP() << "permissions do not bind root";
  ScratchDir dir;
  const std::string path = dir.file("cache.txt");
  ASSERT_TRUE(write_tune_cache(path, test_key(), {test_entry(64)}).is_ok());
  chmod(dir.path().c_str(), 0500);
  const Status s = write_tune_cache(path, test_key(), {test_entry(128)});
  chmod(dir.path().c_str(), 0700);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("path: cannot create"), std::string::npos) << s.message();
  EXPECT_TRUE(same_entries(read_ok(path), {test_entry(64)}));
}

// Threads adding distinct entries at once: every write is whole and none is lost, and a
// reader running meanwhile only ever sees whole files.
TEST(TuneStore, ConcurrentThreadsLoseNothing) {
  ScratchDir dir;
  const std::string path = dir.file("cache.txt");
  constexpr int kThreads = 6;
  constexpr int kEach = 8;
  std::atomic<bool> writing{true};
  std::atomic<int> reads{0};
  std::atomic<int> bad_reads{0};
  std::thread reader([&] {
    while (writing.load()) {
      std::vector<TuneEntry> entries;
      if (!read_tune_cache(path, test_key(), &entries).is_ok()) ++bad_reads;
      ++reads;
    }
  });
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        TuneEntry e = test_entry(std::int64_t{1} << (t + 1), "k" + std::to_string(t) + "_" + std::to_string(i));
        e.cls.gqa = std::int64_t{1} << i;
        if (!write_tune_cache(path, test_key(), {e}).is_ok()) ++failures;
      }
    });
  }
  for (std::thread& w : writers) w.join();
  writing = false;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(bad_reads.load(), 0) << "of " << reads.load() << " reads";
  EXPECT_EQ(read_ok(path).size(), static_cast<std::size_t>(kThreads * kEach));
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"cache.txt", "cache.txt.lock"}));
}

// The same across processes, which share no memory: only the lock and the rename keep
// them apart.
TEST(TuneStore, ConcurrentProcessesLoseNothing) {
  ScratchDir dir;
  const std::string path = dir.file("cache.txt");
  constexpr int kProcesses = 6;
  constexpr int kEach = 8;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int failures = 0;
      for (int i = 0; i < kEach; ++i) {
        TuneEntry e = test_entry(std::int64_t{1} << (p + 1), "p" + std::to_string(p));
        e.cls.gqa = std::int64_t{1} << i;
        if (!write_tune_cache(path, test_key(), {e}).is_ok()) ++failures;
      }
      _exit(failures);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a writer failed";
  }
  const std::vector<TuneEntry> entries = read_ok(path);
  EXPECT_EQ(entries.size(), static_cast<std::size_t>(kProcesses * kEach));
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"cache.txt", "cache.txt.lock"}));
}

}  // namespace
}  // namespace fa3::test
