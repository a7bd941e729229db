// The model's life cycle in a running server: the first load, hot reloads
// (the file changed, SIGHUP, POST /admin/reload, gRPC Reload), unloading
// (SIGUSR1), the damaged-file path (SIGBUS caught in the mapping) and the
// retirement of old generations once their last request has ended.
//
// Two threads of its own, neither on the serving path:
//  - the loader runs one load at a time (a load may take minutes for a large
//    model: reading and verifying every checksum);
//  - the operations thread watches the file, reads the SIGBUS pipe, retires
//    old generations and pings the systemd watchdog while the compute threads
//    make progress. It never waits for a load, so the watchdog keeps going
//    during one.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api.h"
#include "config.h"
#include "file_watcher.h"
#include "metrics.h"
#include "sd_notify.h"
#include "service.h"

namespace colibri::server {

struct ReloadOutcome {
  bool ok = false;       // a model serves after the call (the new one, or the unchanged one)
  bool swapped = false;  // the new file is now current
  std::string reason;
  std::string id, path, checksum;
  double load_seconds = 0;
  std::uint64_t generation = 0;
  std::vector<std::string> config_changes;
  std::optional<ApiError> error;  // when !ok: 400 bad config, 422 bad file, 503 memory or draining
  std::string message;            // one line for logs and gRPC
};

class ModelHost {
 public:
  // Re-reads the configuration (flags, environment, file) as at start.
  using ConfigReader = std::function<Result<LoadedConfig>()>;

  ModelHost(Service& service, Metrics& metrics, const SystemdNotifier& notifier, ConfigReader reader);
  ~ModelHost();
  ModelHost(const ModelHost&) = delete;
  ModelHost& operator=(const ModelHost&) = delete;

  // The write end of the pipe the SIGBUS handler signals through.
  int sigbus_notify_fd() const { return pipe_[1]; }

  // The first load, on the caller's thread (checksums per verify_checksums).
  // Ends the service's first-load state (begin_first_load) either way.
  Status load_initial();
  // Starts the loader and operations threads.
  void start();

  // Re-reads the config (when `reread_config`), applies its hot keys, loads
  // and verifies the model and swaps it in. Waits for the result.
  ReloadOutcome reload(const std::string& reason, bool reread_config);
  // The same without waiting (signal handling thread).
  void request_reload(const std::string& reason, bool reread_config);
  // Makes the server model-less: /ready 503, generations 503; running
  // requests finish on the unloaded model, which is freed after them.
  void unload(const std::string& reason);

  // Sessions running and requests queued on every live generation.
  std::size_t active_sessions() const;
  std::size_t queue_depth() const;
  std::size_t retiring() const;

  // Ends the threads, then every generation's scheduler (their running
  // requests get an in-stream "shutting down" error).
  void stop();

 private:
  struct Job {
    enum class Kind { Reload, Unload } kind = Kind::Reload;
    std::string reason;
    bool reread_config = false;
    bool from_watcher = false;
    std::shared_ptr<std::promise<ReloadOutcome>> done;
  };

  void enqueue(Job job);
  void loader_main();
  void operations_main();
  ReloadOutcome run_reload(const Job& job);
  void run_unload(const std::string& reason);
  void retire(std::shared_ptr<Generation> generation);
  void reap();
  void retarget_watcher(const FileStamp& attempted);
  void announce_status() const;

  Service& service_;
  Metrics& metrics_;
  const SystemdNotifier& notifier_;
  ConfigReader reader_;
  int pipe_[2] = {-1, -1};
  std::uint64_t next_generation_ = 1;  // loader thread (and load_initial before it)

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> jobs_;                                 // guarded by mutex_
  std::vector<std::shared_ptr<Generation>> retired_;     // guarded by mutex_
  bool stopping_ = false;                                // guarded by mutex_
  bool loading_ = false;                                 // guarded by mutex_

  std::mutex watcher_mutex_;
  FileWatcher watcher_;  // guarded by watcher_mutex_
  std::uint64_t damage_seen_ = 0;  // operations thread: generation number whose damage was handled

  std::thread loader_, operations_;
};

}  // namespace colibri::server
