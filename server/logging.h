// The server's logging: spdlog's asynchronous logger (a bounded queue drained
// by one background thread; when full the oldest message is dropped, so no
// thread -- least of all the compute thread -- ever waits for a sink) feeding
//  - stderr,
//  - optionally a file (log_file), written through a buffered stream and
//    flushed in batches: every second and at every error,
//  - a ring of the last log_ring_lines lines, served at GET /admin/logs.
// Control characters in messages are escaped (\x0a) so a logged value can
// never forge a line of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"

namespace colibri::server::logging {

// Once, at start, before any thread that logs.
Status init(const std::string& level, const std::string& file, std::size_t ring_lines);
// Level names: trace, debug, info, warn, error, off.
Status set_level(const std::string& level);
std::string level();
// Opens `file` (again: after logrotate moved it away) or closes it ("").
Status set_file(const std::string& file);
// The last `n` lines kept (at most log_ring_lines), oldest first.
std::vector<std::string> recent(std::size_t n);
// Writes or flushes of log_file that failed (a full disk): lines were lost.
std::uint64_t file_errors();
// Flushes and stops the logger thread.
void shutdown();

}  // namespace colibri::server::logging
