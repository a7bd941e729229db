#include "http_routes.h"

namespace colibri::server {

const std::vector<HttpRoute>& http_routes() {
  static const std::vector<HttpRoute> kRoutes = {
      {"GET", "/health", "/health"},
      {"GET", "/ready", "/ready"},
      {"GET", "/metrics", "/metrics"},
      {"GET", "/v1/models", "/v1/models"},
      {"GET", "/v1/models/(.+)", "/v1/models/{id}"},
      {"POST", "/v1/completions", "/v1/completions"},
      {"POST", "/v1/chat/completions", "/v1/chat/completions"},
      {"POST", "/v1/messages", "/v1/messages"},
      {"POST", "/v1/messages/count_tokens", "/v1/messages/count_tokens"},
      {"POST", "/tokenize", "/tokenize"},
      {"POST", "/detokenize", "/detokenize"},
      {"POST", "/v1/route", "/v1/route"},
      {"GET", "/admin/config", "/admin/config"},
      {"POST", "/admin/reload", "/admin/reload"},
      {"GET", "/admin/logs", "/admin/logs"},
      {"POST", "/admin/log-level", "/admin/log-level"},
  };
  return kRoutes;
}

}  // namespace colibri::server
