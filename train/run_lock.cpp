#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace llmt {

namespace fs = std::filesystem;

RunLock::RunLock(const std::string& dir, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  // The directory's own error (a read-only file system, no permission), not the lock file's
  // ENOENT that would follow it.
  if (ec)
    throw ConfigError(what + "=\"" + dir + "\": cannot create the directory (" + ec.message() +
                      ")");
  const std::string path = (fs::path(dir) / ".llmtrain.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw ConfigError(what + "=\"" + dir + "\": cannot create " + path + " (" +
                      std::strerror(errno) + ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string who(holder, n > 0 ? static_cast<size_t>(n) : 0);
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    if (err == EWOULDBLOCK)
      throw ConfigError(what + "=\"" + dir + "\" is in use by another llmtrain run (" +
                        (who.empty() ? std::string("holder unknown") : who) +
                        "): two runs would overwrite each other's checkpoints and metrics. Wait "
                        "for it to end, or give this run another directory");
    throw ConfigError(what + "=\"" + dir + "\": cannot lock " + path + " (" + std::strerror(err) +
                      ")");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = detail::concat("host ", host, ", pid ", ::getpid(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    // The lock holds without the note; a second run then says "holder unknown".
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace llmt
