// Test support for tests/server: starts colibri-server on 127.0.0.1 with port 0,
// reads the bound ports from its stdout, and always stops it (SIGTERM, then
// SIGKILL; the child also dies with the test process via PR_SET_PDEATHSIG).
// Plus small HTTP helpers over cpp-httplib's client and an SSE reader.
#pragma once

#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace colibri::test {

using json = nlohmann::json;

inline std::string fixture_dir(const std::string& name = "qwen3moe-tiny") {
  return std::string(COLIBRI_TEST_DATA_DIR) + "/fixtures/" + name;
}

class ServerProcess {
 public:
  // Starts the server with --model <fixture> --port 0 and `args`; `env` entries
  // are NAME=VALUE. Returns nullptr (and fills `error`) if it does not come up
  // within `timeout`.
  static std::unique_ptr<ServerProcess> start(std::vector<std::string> args, std::string& error,
                                              std::vector<std::string> env = {},
                                              std::chrono::seconds timeout = std::chrono::seconds(30)) {
    return launch(std::move(args), error, std::move(env), timeout, false);
  }
  // The same, returning as soon as HTTP listens, while the model still loads
  // (the "loading ...; http://127.0.0.1:PORT answers 503" line).
  static std::unique_ptr<ServerProcess> start_loading(std::vector<std::string> args, std::string& error,
                                                      std::vector<std::string> env = {}) {
    return launch(std::move(args), error, std::move(env), std::chrono::seconds(30), true);
  }

  ~ServerProcess() { stop(); }

 private:
  static std::unique_ptr<ServerProcess> launch(std::vector<std::string> args, std::string& error,
                                               std::vector<std::string> env, std::chrono::seconds timeout,
                                               bool while_loading) {
    auto server = std::unique_ptr<ServerProcess>(new ServerProcess());
    server->stderr_path_ = "/tmp/colibri-server-test-" + std::to_string(getpid()) + "-" +
                           std::to_string(counter()++) + ".log";
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      error = "pipe failed";
      return nullptr;
    }
    std::vector<std::string> argv = {COLIBRI_SERVER_BIN};
    bool has_model = false, has_port = false;
    for (const auto& a : args) {
      has_model |= a == "--model";
      has_port |= a == "--port";
    }
    if (!has_model) argv.insert(argv.end(), {"--model", fixture_dir()});
    if (!has_port) argv.insert(argv.end(), {"--port", "0"});
    argv.insert(argv.end(), args.begin(), args.end());
    // Everything the child needs is built before fork(): after it only
    // async-signal-safe calls are made.
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
    envs.insert(envs.end(), env.begin(), env.end());
    std::vector<char*> cenv;
    for (auto& e : envs) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      // Child: dies with the test process even if the test crashes.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      dup2(out[1], STDOUT_FILENO);
      int log = open(server->stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (log >= 0) dup2(log, STDERR_FILENO);
      execve(cargv[0], cargv.data(), cenv.data());
      _exit(127);
    }
    close(out[1]);
    server->pid_ = pid;
    server->stdout_fd_ = out[0];
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string buffer;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out[0], POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        char chunk[512];
        ssize_t n = read(out[0], chunk, sizeof(chunk));
        if (n <= 0) break;  // the server exited
        buffer.append(chunk, static_cast<std::size_t>(n));
        std::size_t at = buffer.find("grpc listening on 127.0.0.1:");
        if (at != std::string::npos) server->grpc_port_ = std::atoi(buffer.c_str() + at + 28);
        // "listening on http://HOST:PORT" (any host: 127.0.0.1, 0.0.0.0, [::1]).
        if (const int port = port_after(buffer, "listening on http://"); port > 0) {
          server->port_ = port;
          return server;
        }
        if (const int port = port_after(buffer, "; http://"); while_loading && port > 0) {
          server->port_ = port;
          return server;
        }
      }
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        server->pid_ = -1;
        break;
      }
    }
    error = "colibri-server did not start; stdout: " + buffer + "\nstderr: " + server->log();
    return nullptr;
  }

 public:

  // Waits for the process to exit by itself; returns its wait status, or -1
  // (after stopping it) if it is still running after `timeout`.
  int wait_exit(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = -1;
    while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop();
    return -1;
  }

  // SIGTERM and wait (the drain is short when idle); SIGKILL after 10 s.
  int stop() {
    int status = -1;
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      for (int i = 0; i < 200; ++i) {
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (pid_ > 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        pid_ = -1;
      }
    }
    if (stdout_fd_ >= 0) close(stdout_fd_);
    stdout_fd_ = -1;
    if (!stderr_path_.empty()) std::remove(stderr_path_.c_str());
    stderr_path_.clear();
    return status;
  }

  int port() const { return port_; }
  int grpc_port() const { return grpc_port_; }
  pid_t pid() const { return pid_; }
  std::string log() const {
    std::ifstream in(stderr_path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  ServerProcess() = default;
  // The port of the first complete "<marker>HOST:PORT" in `text`, or 0.
  static int port_after(const std::string& text, const std::string& marker) {
    const std::size_t at = text.find(marker);
    if (at == std::string::npos) return 0;
    const std::size_t end = text.find_first_of(" \n", at + marker.size());
    if (end == std::string::npos || text.find('\n', at) == std::string::npos) return 0;
    const std::size_t colon = text.rfind(':', end);
    return colon == std::string::npos || colon < at + marker.size() ? 0 : std::atoi(text.c_str() + colon + 1);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int port_ = 0;
  int grpc_port_ = 0;
  std::string stderr_path_;
};

struct HttpResult {
  int status = 0;  // 0: no response (connection error or timeout)
  std::string body;
  httplib::Headers headers;
  json json_body() const { return json::parse(body, nullptr, false); }
};

inline httplib::Client make_client(int port, int read_timeout_s = 60) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(read_timeout_s, 0);
  client.set_write_timeout(10, 0);
  return client;
}

inline HttpResult http_get(int port, const std::string& path, const httplib::Headers& headers = {}) {
  auto client = make_client(port);
  auto res = client.Get(path, headers);
  if (!res) return {};
  return {res->status, res->body, res->headers};
}

inline HttpResult http_post(int port, const std::string& path, const std::string& body,
                            const httplib::Headers& headers = {}, int read_timeout_s = 60) {
  auto client = make_client(port, read_timeout_s);
  auto res = client.Post(path, headers, body, "application/json");
  if (!res) return {};
  return {res->status, res->body, res->headers};
}

inline HttpResult http_post(int port, const std::string& path, const json& body, const httplib::Headers& headers = {}) {
  return http_post(port, path, body.dump(), headers);
}

// A streamed SSE response: the JSON of every data event, whether [DONE] came.
struct SseResult {
  int status = 0;
  std::vector<json> events;
  bool done = false;
  std::string raw;
};

// Posts and reads the SSE stream. `on_event` may return false to close the
// connection mid-stream (the client disconnects).
inline SseResult http_stream(int port, const std::string& path, const json& body,
                             const std::function<bool(const json&)>& on_event = {},
                             const httplib::Headers& headers = {}) {
  SseResult result;
  auto client = make_client(port);
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.headers = headers;
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  std::string buffer;
  request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
    result.raw.append(data, size);
    buffer.append(data, size);
    std::size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      if (event == "data: [DONE]") {
        result.done = true;
        continue;
      }
      json parsed = json::parse(event.substr(6), nullptr, false);
      result.events.push_back(parsed);
      if (on_event && !on_event(parsed)) return false;
    }
    return true;
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  client.send(request, response, error);
  result.status = response.status > 0 ? response.status : 0;
  if (result.status != 200 && result.events.empty()) result.raw = response.body;
  return result;
}

// Reads one sample value from /metrics text ("name" or "name{labels}").
inline double metric_value(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::atof(line.c_str() + series.size() + 1);
  }
  return -1;
}

}  // namespace colibri::test
