// The tuning cache on disk: reading it whole, and replacing it atomically.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "api/tune_format.h"
#include "common/status_macros.h"
#include "fa3/tune.h"

namespace fa3 {
namespace {

// A cache holds tens of lines of about 80 bytes; a file this large is something else,
// and is not read into memory.
constexpr std::size_t kMaxCacheBytes = std::size_t{4} << 20;

Status invalid(const std::string& msg) { return {StatusCode::kInvalidArgument, msg}; }

Status io_error(const std::string& what, const std::string& path, int err) {
  return invalid("path: cannot " + what + " '" + path + "': " + std::strerror(err));
}

// A file descriptor, closed when it goes out of scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  // Closes now, reporting the error a deferred write may surface only here.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// The whole file at `path` into `text`; `*exists` is false (and the status ok) when
// there is no such file.
Status read_whole(const std::string& path, std::string* text, bool* exists) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  *exists = fd.get() >= 0 || errno != ENOENT;
  if (fd.get() < 0) return *exists ? io_error("open", path, errno) : Status::ok();
  text->clear();
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("read", path, errno);
    if (n == 0) return Status::ok();
    text->append(buf, static_cast<std::size_t>(n));
    if (text->size() > kMaxCacheBytes) {
      return invalid("'" + path + "': larger than " + std::to_string(kMaxCacheBytes >> 20) +
                     " MiB, which no tuning cache is");
    }
  }
}

Status write_whole(int fd, const std::string& text, const std::string& path) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("write", path, errno);
    done += static_cast<std::size_t>(n);
  }
  return Status::ok();
}

// A name no other writer uses at the same time: this process's id, and a counter for
// its threads.
std::string temporary_name(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
}

// `text` into `path` atomically: written whole and flushed to disk under a temporary
// name in the same directory, then renamed over `path` (rename replaces atomically
// within one file system). The temporary file is removed on failure.
Status replace_file(const std::string& path, const std::string& text) {
  const std::string temp = temporary_name(path);
  FileDescriptor fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return io_error("create", temp, errno);
  Status status = write_whole(fd.get(), text, temp);
  if (status.is_ok() && ::fsync(fd.get()) != 0) status = io_error("flush", temp, errno);
  if (fd.close() != 0 && status.is_ok()) status = io_error("write", temp, errno);
  if (status.is_ok() && ::rename(temp.c_str(), path.c_str()) != 0) status = io_error("rename onto", path, errno);
  if (!status.is_ok()) ::unlink(temp.c_str());
  return status;
}

// `entries` laid over `existing`: an entry replaces the one of its class.
std::vector<TuneEntry> merged(std::vector<TuneEntry> existing, const std::vector<TuneEntry>& entries) {
  for (const TuneEntry& e : entries) {
    auto same = std::find_if(existing.begin(), existing.end(), [&](const TuneEntry& x) { return x.cls == e.cls; });
    if (same != existing.end()) {
      *same = e;
    } else {
      existing.push_back(e);
    }
  }
  // A stable order keeps the file readable and the same for the same contents.
  std::sort(existing.begin(), existing.end(), [](const TuneEntry& a, const TuneEntry& b) { return a.cls < b.cls; });
  return existing;
}

Status check_path(const std::string& path) {
  if (!path.empty()) return Status::ok();
  return invalid("path: empty (no cache location: set FA3_TUNE_CACHE, or XDG_CACHE_HOME or HOME)");
}

}  // namespace

Status read_tune_cache(const std::string& path, const TuneKey& key, std::vector<TuneEntry>* entries) {
  FA3_RETURN_IF_ERROR(check_path(path));
  std::string text;
  bool exists = false;
  FA3_RETURN_IF_ERROR(read_whole(path, &text, &exists));
  std::vector<TuneEntry> read;
  if (exists) {
    const Status status = parse_tune_cache(text, key, &read);
    if (!status.is_ok()) return {status.code(), "'" + path + "': " + status.message()};
  }
  *entries = std::move(read);
  return Status::ok();
}

Status write_tune_cache(const std::string& path, const TuneKey& key, const std::vector<TuneEntry>& entries) {
  FA3_RETURN_IF_ERROR(check_path(path));
  FA3_RETURN_IF_ERROR(check_tune_contents(key, entries));
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return invalid("path: cannot create the directory '" + dir.string() + "': " + ec.message());

  // Writers take turns from reading the old file to renaming the new one, so that none
  // loses another's entries. The lock is advisory and released when the descriptor closes
  // (also when the process dies). Readers need no lock: the rename is atomic.
  const std::string lock_path = path + ".lock";
  FileDescriptor lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.get() < 0) return io_error("create", lock_path, errno);
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return io_error("lock", lock_path, errno);
  }
  std::vector<TuneEntry> existing;
  if (!read_tune_cache(path, key, &existing).is_ok()) existing.clear();  // a file fa3 refuses is replaced
  return replace_file(path, format_tune_cache(key, merged(std::move(existing), entries)));
}

}  // namespace fa3
