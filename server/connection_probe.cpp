#include "connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

namespace colibri::server {

namespace {

// Formats an address as cpp-httplib does (getnameinfo, numeric host).
bool address_of(const sockaddr_storage& address, socklen_t length, std::string& host, int& port) {
  char name[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, name, sizeof(name), nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return false;
  host = name;
  if (address.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  else if (address.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  else return false;
  return true;
}

bool matches(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISSOCK(info.st_mode)) return false;
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  std::string host;
  int port = -1;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  if (!address_of(address, length, host, port) || port != remote_port || host != remote_addr) return false;
  length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  return address_of(address, length, host, port) && port == local_port && host == local_addr;
}

}  // namespace

ConnectionProbe ConnectionProbe::find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                      int remote_port) {
  ConnectionProbe probe;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return probe;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (matches(static_cast<int>(fd), local_addr, local_port, remote_addr, remote_port)) {
      probe.fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return probe;
}

bool ConnectionProbe::closed() const {
  if (fd_ < 0) return false;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace colibri::server
