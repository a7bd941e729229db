#include "connection_probe.h"

#include <poll.h>

namespace colibri::server {

bool ConnectionProbe::closed() const {
  if (fd_ < 0) return false;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace colibri::server
