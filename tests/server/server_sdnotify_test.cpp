// systemd notification: the server started with NOTIFY_SOCKET pointing at a
// datagram socket this test reads (what systemd does for Type=notify) sends
// READY=1 once it serves, WATCHDOG=1 every WATCHDOG_USEC/2, RELOADING=1 then
// READY=1 around a SIGHUP reload, and STOPPING=1 with EXTEND_TIMEOUT_USEC when
// SIGTERM starts the drain.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <filesystem>

#include "server_harness.h"

namespace colibri::test {
namespace {

class NotifySocket {
 public:
  NotifySocket() {
    path_ = std::filesystem::temp_directory_path() / ("colibri-notify-" + std::to_string(getpid()) + ".sock");
    std::filesystem::remove(path_);
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path_.c_str());
    bound_ = bind(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~NotifySocket() {
    close(fd_);
    std::filesystem::remove(path_);
  }
  bool bound() const { return bound_; }
  std::string path() const { return path_.string(); }

  // Collects datagrams until one contains `needle` or `limit` passes.
  bool wait_for(const std::string& needle, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buffer[4096];
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) continue;
      const std::string message(buffer, static_cast<std::size_t>(n));
      received_.push_back(message);
      if (message.find(needle) != std::string::npos) return true;
    }
    return false;
  }
  std::string all() const {
    std::string text;
    for (const auto& m : received_) text += "[" + m + "] ";
    return text;
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool bound_ = false;
  std::vector<std::string> received_;
};

TEST(SystemdNotify, ReadyWatchdogReloadingStopping) {
  NotifySocket notify;
  ASSERT_TRUE(notify.bound());
  std::string error;
  auto server = ServerProcess::start({"--grpc-port", "-1"}, error,
                                     {"NOTIFY_SOCKET=" + notify.path(), "WATCHDOG_USEC=400000"});
  ASSERT_NE(server, nullptr) << error;
  using std::chrono::milliseconds;
  EXPECT_TRUE(notify.wait_for("READY=1", milliseconds(5000))) << notify.all();
  EXPECT_TRUE(notify.wait_for("WATCHDOG=1", milliseconds(2000))) << notify.all();
  kill(server->pid(), SIGHUP);
  EXPECT_TRUE(notify.wait_for("RELOADING=1", milliseconds(5000))) << notify.all();
  EXPECT_TRUE(notify.wait_for("READY=1", milliseconds(10000))) << notify.all();
  kill(server->pid(), SIGTERM);
  EXPECT_TRUE(notify.wait_for("STOPPING=1", milliseconds(5000))) << notify.all();
  // The drain's own time, so TimeoutStopSec= does not cut it short.
  EXPECT_NE(notify.all().find("STOPPING=1\nEXTEND_TIMEOUT_USEC="), std::string::npos) << notify.all();
  const int status = server->wait_exit(std::chrono::seconds(15));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "exit status " << status;
}

}  // namespace
}  // namespace colibri::test
