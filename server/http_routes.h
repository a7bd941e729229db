// The HTTP API's route table: what HttpServer installs handlers for, and what
// 405 detection, metrics labels and the API-key coverage test read. A file of
// its own so tests can read it without the HTTP transport's translation unit.
#pragma once

#include <vector>

namespace colibri::server {

struct HttpRoute {
  const char* method;
  const char* pattern;  // regular expression cpp-httplib matches against the path
  const char* label;    // endpoint label in metrics and logs
};

const std::vector<HttpRoute>& http_routes();

}  // namespace colibri::server
