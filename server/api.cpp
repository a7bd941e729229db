#include "api.h"

#include "core/utf8.h"

namespace colibri::server {

namespace {

ApiError make(int status, std::string type, std::string message, std::string code = {}) {
  ApiError error;
  error.status = status;
  error.type = std::move(type);
  error.message = std::move(message);
  error.code = std::move(code);
  return error;
}

}  // namespace

std::string quote_untrusted(std::string_view text) {
  constexpr std::size_t kMax = 64;
  std::string out = utf8_lossy(text.substr(0, kMax));
  if (text.size() > kMax) out += "...";
  return out;
}

ApiError ApiError::invalid(std::string message, std::string param, std::string code) {
  ApiError error = make(400, "invalid_request_error", std::move(message), std::move(code));
  error.param = std::move(param);
  return error;
}

ApiError ApiError::not_found(std::string message, std::string code) {
  return make(404, "invalid_request_error", std::move(message), std::move(code));
}

ApiError ApiError::unauthorized(std::string message) {
  return make(401, "authentication_error", std::move(message), "invalid_api_key");
}

ApiError ApiError::too_large(std::string message) {
  return make(413, "invalid_request_error", std::move(message), "request_too_large");
}

ApiError ApiError::overloaded(std::string message, int retry_after_s) {
  ApiError error = make(429, "rate_limit_error", std::move(message), "server_overloaded");
  error.retry_after_s = retry_after_s;
  return error;
}

ApiError ApiError::unavailable(std::string message, int retry_after_s) {
  ApiError error = make(503, "unavailable_error", std::move(message), "unavailable");
  error.retry_after_s = retry_after_s;
  return error;
}

ApiError ApiError::not_implemented(std::string message) {
  return make(501, "not_implemented_error", std::move(message), "not_implemented");
}

ApiError ApiError::internal(std::string message) {
  return make(500, "server_error", std::move(message), "internal_error");
}

nlohmann::json ApiError::to_json() const {
  nlohmann::json body = {{"message", message},
                         {"type", type},
                         {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
                         {"code", code.empty() ? nlohmann::json() : nlohmann::json(code)}};
  for (const auto& [key, value] : extra.items()) body[key] = value;
  return {{"error", body}};
}

const char* finish_name(Finish finish) {
  switch (finish) {
    case Finish::Stop: return "stop";
    case Finish::Length: return "length";
    case Finish::Cancelled: return "cancelled";
    case Finish::SlowClient: return "slow_client";
    case Finish::Error: return "error";
    case Finish::Shutdown: return "shutdown";
  }
  return "unknown";
}

}  // namespace colibri::server
