#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tessera/server/server.h"

namespace tessera::server {
namespace {

using ::testing::HasSubstr;

std::string Write(const std::string& name, const std::string& text) {
  std::string path =
      ::testing::TempDir() + "server-config-" + std::to_string(getpid()) + "-" + name + ".yaml";
  std::ofstream(path) << text;
  return path;
}

// A student's CLI on a lab machine finds the installed server with no variable; someone running
// their own server (listening at their default) gets that one.
TEST(ClientSocket, TheUsersOwnServerWhenListeningElseTheSystemOne) {
  std::vector<std::string> asked;
  auto listening = [&](bool yes) {
    return [&asked, yes](const std::string& p) {
      asked.push_back(p);
      return yes;
    };
  };
  EXPECT_EQ(ClientSocketPath("/run/user/1000/tessera.sock", listening(true)),
            "/run/user/1000/tessera.sock");
  EXPECT_EQ(ClientSocketPath("/run/user/1000/tessera.sock", listening(false)), kSystemSocket);
  EXPECT_EQ(asked, (std::vector<std::string>{"/run/user/1000/tessera.sock",
                                             "/run/user/1000/tessera.sock"}));
  // Root's own default is the system socket: nothing to look for.
  EXPECT_EQ(ClientSocketPath(kSystemSocket, listening(false)), kSystemSocket);
  EXPECT_EQ(asked.size(), 2u);
}

TEST(ServerConfig, ReadsEverySetting) {
  ServerConfig c = DefaultServerConfig();
  std::string path = Write("full", R"(socket: /tmp/t.sock
state_dir: /tmp/state
tcp:
  listen: "127.0.0.1:7070"
  tokens:
    - {token: "0123456789abcdef", user: nobody, admin: true}
simulate: t4x2
policy: fgd
admins: [alice]
quotas:
  bob: {gpus: 2, gpu_share: 2.5, gpu_memory: 100GiB}
group_quotas:
  ml: {gpus: 4}
preemption: {requeue: false, grace_period_s: 3}
unhealthy_gpu: fail
max_body_bytes: 4096
context_overhead: 300MiB
poll_interval_s: 0.1
history: {interval_s: 2, window_s: 7200}
priority_ceiling: 10
priority_ceilings: {alice: 500, "group:ml": 100}
preempt_others: [alice, "group:ml"]
fair_share: {half_life_s: 7200}
backfill: {reservations: 1}
utilization_ceiling: 60%
utilization_ceiling_strict: true
auto_size_margin: 35%
auto_size_trial: 5m
mps: {gpus: [1, GPU-abc], control: /opt/nvidia/mps-control, check_interval_s: 0.5}
max_array_tasks: 500
listener:
  idle_timeout_s: 30
  request_timeout_s: 5
  max_connections: 100
  max_connections_per_peer: 8
containers:
  podman: /opt/podman/bin/podman
  cdi_spec_dir: /etc/cdi
  run_args: [--pull=never, --runtime, runc]
confinement: {mode: cgroup2, cgroup: gpu-jobs, device_dir: /srv/dev, pids_max: 100,
              user_pids_max: 500, private_tmp: false}
)");
  absl::Status st = LoadServerConfig(path, &c);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(c.socket, "/tmp/t.sock");
  EXPECT_EQ(c.tcp_listen, "127.0.0.1:7070");
  ASSERT_EQ(c.tokens.size(), 1u);
  EXPECT_TRUE(c.tokens[0].admin);
  ASSERT_NE(getpwnam("nobody"), nullptr);
  EXPECT_EQ(c.tokens[0].uid, getpwnam("nobody")->pw_uid) << "a token runs as its local account";
  EXPECT_FALSE(c.allow_root_jobs) << "root's jobs are refused unless the file says otherwise";
  EXPECT_EQ(c.quotas.at("bob").limit.gpus, 2);
  EXPECT_EQ(c.quotas.at("bob").limit.gpu_milli, 2500);
  EXPECT_EQ(c.quotas.at("bob").limit.gpu_memory_mib, 102400);
  EXPECT_EQ(c.group_quotas.at("ml").limit.gpus, 4);
  EXPECT_EQ(c.group_quotas.at("ml").limit.gpu_milli, -1) << "what is not set is unlimited";
  EXPECT_FALSE(c.requeue_preempted);
  EXPECT_EQ(c.grace_period_s, 3);
  EXPECT_EQ(c.priority_ceiling, 10);
  EXPECT_EQ(c.fair_share_half_life_s, 7200);
  EXPECT_EQ(c.backfill_reservations, 1);
  EXPECT_EQ(c.utilization_ceiling_pct, 60);
  EXPECT_TRUE(c.utilization_ceiling_strict);
  EXPECT_EQ(c.auto_size_margin_pct, 35);
  EXPECT_EQ(c.auto_size_trial_s, 300);
  EXPECT_EQ(c.mps_gpus, (std::vector<std::string>{"1", "GPU-abc"}));
  EXPECT_EQ(c.mps_control, "/opt/nvidia/mps-control");
  EXPECT_EQ(c.mps_check_interval_s, 0.5);
  EXPECT_EQ(c.history_interval_s, 2);
  EXPECT_EQ(c.history_window_s, 7200);
  EXPECT_EQ(c.max_array_tasks, 500u);
  EXPECT_EQ(c.idle_timeout_s, 30);
  EXPECT_EQ(c.request_timeout_s, 5);
  EXPECT_EQ(c.max_connections, 100u);
  EXPECT_EQ(c.max_connections_per_peer, 8u);
  EXPECT_EQ(c.priority_ceilings.at("alice"), 500);
  EXPECT_EQ(c.priority_ceilings.at("group:ml"), 100);
  EXPECT_TRUE(c.preempt_others.contains("group:ml"));
  EXPECT_EQ(c.unhealthy_action, "fail");
  EXPECT_EQ(c.max_body_bytes, 4096u);
  EXPECT_EQ(c.context_overhead_bytes, 300ull << 20);
  EXPECT_TRUE(c.admins.contains("alice"));
  EXPECT_EQ(c.podman, "/opt/podman/bin/podman");
  EXPECT_EQ(c.cdi_spec_dir, "/etc/cdi");
  EXPECT_THAT(c.podman_run_args, ::testing::ElementsAre("--pull=never", "--runtime", "runc"));
  EXPECT_EQ(c.confinement, "cgroup2");
  EXPECT_EQ(c.cgroup_name, "gpu-jobs");
  EXPECT_EQ(c.device_dir, "/srv/dev");
  EXPECT_EQ(c.pids_max, 100);
  EXPECT_EQ(c.user_pids_max, 500);
  EXPECT_FALSE(c.private_tmp);
}

TEST(ServerConfig, RefusesBadFilesNamingLineAndKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"sockett: /x\n", ":1: sockett: unknown key"},
      {"socket: /x\npreemption: {requeue: maybe}\n",
       ":2: preemption.requeue: expected true or false"},
      {"preemption: {grace: 3}\n", "preemption.grace: unknown key"},
      {"quotas: {bob: {gpus: -1}}\n", "quotas.bob.gpus: expected a whole number >= 0"},
      {"quotas: {bob: {gpu_memory: lots}}\n", "quotas.bob.gpu_memory: expected a size"},
      {"quotas: {bob: {cpus: 1}}\n", "quotas.bob.cpus: unknown key"},
      {"group_quotas: {ml: {gpus: many}}\n", "group_quotas.ml.gpus: expected a whole number >= 0"},
      {"group_quotas: [ml]\n",
       "group_quotas: expected a map of group: {gpus, gpu_share, gpu_memory}"},
      {"tcp: {listen: \":7070\"}\n", "tcp: a TCP listener needs at least one token"},
      {"tcp: {listen: \":7070\", tokens: [{token: short, user: nobody}]}\n",
       "at least 16 characters"},
      {"tcp:\n  listen: \":7070\"\n  tokens:\n    - {token: 0123456789abcdef, user: nobody}\n"
       "    - {token: 0123456789abcdefg, user: ci-no-such-account}\n",
       ":5: tcp.tokens[1].user: 'ci-no-such-account' has no local account"},
      {"tcp: {listen: \":7070\", tokens: [{token: 0123456789abcdef}]}\n",
       "tcp.tokens[0].user: required"},
      {"tcp: {listen: \":7070\", tokens: [{token: 0123456789abcdef, user: root}]}\n",
       ":1: tcp.tokens[0].user: 'root' is root: this token's jobs would run as root"},
      {"tcp: {listen: \":7070\", tokens: [plain]}\n", "tcp.tokens[0]: expected a map"},
      {"tcp: {listen: \":7070\", tokens: [{token: 0123456789abcdef, metrics_only: yes, user: "
       "nobody}]}\n",
       "tcp.tokens[0]: a metrics_only token has no user and is no admin"},
      {"tcp: {listen: \":7070\", tokens: [{token: 0123456789abcdef, metrics_only: often}]}\n",
       "tcp.tokens[0].metrics_only: expected true or false"},
      {"allow_root_jobs: sometimes\n", ":1: allow_root_jobs: expected true or false"},
      {"fair_share: {half_life_s: -1}\n", "fair_share.half_life_s: expected seconds >= 0"},
      {"fair_share: 3600\n", "fair_share: expected a map with half_life_s"},
      {"backfill: {reservations: -1}\n", "backfill.reservations: expected 0..1000"},
      {"backfill: {easy: true}\n", "backfill.easy: unknown key"},
      {"max_array_tasks: 0\n", "max_array_tasks: expected 1..1000000"},
      {"tcp: {listen: \":7070\", tokens: [{token: 0123456789abcdef, user: nobody}], "
       "tls: {cert: /nonexistent.crt, key: /etc/hostname}}\n",
       ":1: tcp.tls.cert: cannot read /nonexistent.crt: No such file or directory"},
      {"tcp: {listen: \":7070\", tokens: [{token: 0123456789abcdef, user: nobody}], "
       "tls: {cert: /etc/hostname}}\n",
       "tcp.tls.key: required: a PEM file"},
      {"tcp: {tls: [a]}\n", "tcp.tls: expected a map with cert and key"},
      {"confinement: {mode: cgroup3}\n",
       ":1: confinement.mode: expected auto, cgroup2, cgroup1 or off"},
      {"confinement: {cgroup: a/b}\n", "confinement.cgroup: expected a cgroup name"},
      {"preemption: {grace_period_s: 400}\n",
       "preemption: grace_period_s 400 is over max_grace_period_s 300"},
      {"preemption: {max_grace_period_s: -1}\n",
       "preemption.max_grace_period_s: expected seconds in 0..3600"},
      {"limits: {max_log_bytes_per_job: lots}\n",
       "limits.max_log_bytes_per_job: expected a size such as 1GiB"},
      {"limits: {max_running_jobs_per_user: 0}\n",
       "limits.max_running_jobs_per_user: expected a count 1..10000000"},
      {"limits: {max_jobs: 5}\n", "limits.max_jobs: unknown key"},
      {"confinement: {device_dir: dev}\n", "confinement.device_dir: expected an absolute path"},
      {"confinement: {pids_max: -1}\n", "confinement.pids_max: expected a count of tasks"},
      {"confinement: {user_pids_max: -2}\n",
       "confinement.user_pids_max: expected a count of tasks"},
      {"confinement: {private_tmp: perhaps}\n", "confinement.private_tmp: expected true or false"},
      {"limits: {max_queued_bytes_per_user: lots}\n",
       "limits.max_queued_bytes_per_user: expected a size"},
      {"confinement: {devices: all}\n", "confinement.devices: unknown key"},
      {"listener: {request_timeout_s: 0}\n", "listener.request_timeout_s: expected seconds"},
      {"listener: {max_connections: 0}\n", "listener.max_connections: expected a count"},
      {"listener: {keepalive: 1}\n", "listener.keepalive: unknown key"},
      {"priority_ceiling: 2000\n", ":1: priority_ceiling: expected a priority in -1000..1000"},
      {"priority_ceilings: {alice: high}\n", "priority_ceilings.alice: expected a priority"},
      {"priority_ceilings: [alice]\n", "priority_ceilings: expected a map"},
      {"preempt_others: alice\n", "preempt_others: expected a list"},
      {"preempt_others: [[a]]\n", "preempt_others[]: expected a user or group:<name>"},
      {"unhealthy_gpu: ignore\n", "unhealthy_gpu: expected requeue or fail"},
      {"max_body_bytes: 10\n", "max_body_bytes: expected 1024..1073741824"},
      {"poll_interval_s: 0\n", "poll_interval_s: expected 0.01..10"},
      {"utilization_ceiling: 120%\n", "utilization_ceiling: expected a percentage 0..100"},
      {"utilization_ceiling: high\n", "utilization_ceiling: expected a percentage 0..100"},
      {"utilization_ceiling: [70]\n", "utilization_ceiling: expected a percentage such as 70%"},
      {"utilization_ceiling_strict: maybe\n", "utilization_ceiling_strict: expected true or false"},
      {"auto_size_margin: 300%\n", "auto_size_margin: expected a percentage 0..200"},
      {"auto_size_margin: [20]\n", "auto_size_margin: expected a percentage such as 20%"},
      {"auto_size_trial: 2d\n", "auto_size_trial: expected a duration up to a day"},
      {"auto_size_trial: soon\n", "auto_size_trial: expected a duration up to a day"},
      {"mps: [0]\n", "mps: expected a map with gpus, control, check_interval_s"},
      {"mps: {gpu: [0]}\n", "mps.gpu: unknown key"},
      {"mps: {gpus: 0}\n", "mps.gpus: expected a list of GPU indices or UUIDs, or all"},
      {"mps: {gpus: [[0]]}\n", "mps.gpus[]: expected a GPU index or UUID"},
      {"mps: {control: \"\"}\n", "mps.control: expected the control program's name or path"},
      {"mps: {check_interval_s: 0}\n", "mps.check_interval_s: expected 0.05..600 seconds"},
      {"containers: podman\n", "containers: expected a map with podman, cdi_spec_dir and run_args"},
      {"containers: {docker: x}\n", "containers.docker: unknown key"},
      {"containers: {cdi_spec_dir: cdi}\n",
       "containers.cdi_spec_dir: expected an absolute folder path"},
      {"containers: {run_args: --rm}\n", "containers.run_args: expected a list"},
      {"containers: {run_args: [[a]]}\n", "containers.run_args[]: expected a string"},
      {"socket: [a\n", "server-config"},
      {"- a\n- b\n", "expected a map of settings"},
  };
  int i = 0;
  for (const auto& [text, want] : cases) {
    ServerConfig c = DefaultServerConfig();
    std::string path = Write("bad" + std::to_string(i++), text);
    absl::Status st = LoadServerConfig(path, &c);
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(st.message()), HasSubstr(want)) << text;
    EXPECT_THAT(std::string(st.message()), HasSubstr(path)) << "names the file: " << st.message();
  }
  ServerConfig c;
  EXPECT_EQ(LoadServerConfig("/nonexistent/server.yaml", &c).code(), absl::StatusCode::kNotFound);
}

TEST(ServerConfig, AMetricsOnlyTokenNeedsNoAccount) {
  const std::string path = ::testing::TempDir() + "metrics-token.yaml";
  std::ofstream(path) << "tcp:\n  listen: \"127.0.0.1:0\"\n  tokens:\n"
                         "    - {token: scrape-0123456789abcdef, metrics_only: true}\n";
  ServerConfig c;
  ASSERT_TRUE(LoadServerConfig(path, &c).ok());
  ASSERT_EQ(c.tokens.size(), 1u);
  EXPECT_TRUE(c.tokens[0].metrics_only);
  EXPECT_FALSE(c.tokens[0].admin);
  EXPECT_EQ(c.tokens[0].user, "");
  std::remove(path.c_str());
}

TEST(ServerConfig, TokenForRootOnlyWhenRootJobsAreAllowed) {
  ServerConfig c = DefaultServerConfig();
  std::string path =
      Write("root-token",
            "tcp:\n  listen: \":7070\"\n  tokens: [{token: 0123456789abcdef, user: root}]\n"
            "allow_root_jobs: true\n");
  ASSERT_TRUE(LoadServerConfig(path, &c).ok());
  EXPECT_TRUE(c.allow_root_jobs);
  ASSERT_EQ(c.tokens.size(), 1u);
  EXPECT_EQ(c.tokens[0].uid, 0u);
}

// scripts/run and `tessera admin token` edit the config through the YAML library: a hand-edited
// file keeps every entry (the old sed matched every token line: an entry vanished, root's line was
// mangled, every token got 401); an existing token is found without a write.
TEST(EnsureToken, KeepsAHandEditedFileAndAddsOnlyWhatIsMissing) {
  const std::string path = Write("hand-edited", R"(# the lab's server
tcp:
  listen: "127.0.0.1:7070"
  tokens:
    - {token: "student-token-0123456789", user: nobody, admin: false}   # a student
    - token: "admin-token-abcdefghijklmn"
      user: root
      admin: true
allow_root_jobs: true
limits: {default_runtime: 2h, max_queued_bytes_per_user: 2MiB}
)");
  chmod(path.c_str(), 0600);
  std::ifstream before_in(path);
  const std::string before((std::istreambuf_iterator<char>(before_in)), {});
  bool added = true;
  auto root = EnsureToken(path, "root", true, &added);
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(*root, "admin-token-abcdefghijklmn");
  EXPECT_FALSE(added);
  std::ifstream same_in(path);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(same_in)), {}), before) << "not rewritten";
  // A user without one: added, everything else kept, the file still the loader's and 0600.
  auto daemon = EnsureToken(path, "daemon", false, &added);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  EXPECT_TRUE(added);
  EXPECT_EQ(daemon->size(), 24u);
  ServerConfig c;
  ASSERT_TRUE(LoadServerConfig(path, &c).ok());
  EXPECT_EQ(c.max_queued_bytes_per_user, uint64_t{2} << 20);
  ASSERT_EQ(c.tokens.size(), 3u);
  EXPECT_EQ(c.tokens[0].token, "student-token-0123456789");
  EXPECT_EQ(c.tokens[0].user, "nobody");
  EXPECT_EQ(c.tokens[1].token, "admin-token-abcdefghijklmn");
  EXPECT_TRUE(c.tokens[1].admin);
  EXPECT_EQ(c.tokens[2].token, *daemon);
  EXPECT_FALSE(c.tokens[2].admin);
  EXPECT_EQ(c.tcp_listen, "127.0.0.1:7070");
  EXPECT_EQ(c.default_runtime_s, 7200);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::ifstream bak_in(path + ".bak");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(bak_in)), {}), before)
      << "the file as it was, comments and all";
  // A student's own (not admin) token is not an admin's: asked for one, a new one is added.
  auto nobody_admin = EnsureToken(path, "nobody", true, &added);
  ASSERT_TRUE(nobody_admin.ok());
  EXPECT_NE(*nobody_admin, "student-token-0123456789");
  EXPECT_TRUE(added);
  // A file the loader refuses is refused unchanged.
  const std::string bad =
      Write("bad-token-file", "tcp: {tokens: [{token: short, user: nobody}]}\n");
  std::ifstream bad_in(bad);
  const std::string bad_text((std::istreambuf_iterator<char>(bad_in)), {});
  auto refused = EnsureToken(bad, "root", true, &added);
  EXPECT_FALSE(refused.ok());
  std::ifstream after_in(bad);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(after_in)), {}), bad_text);
  // No file: made, 0600, with the one token.
  const std::string fresh = ::testing::TempDir() + "fresh-" + std::to_string(getpid()) + ".yaml";
  unlink(fresh.c_str());
  auto made = EnsureToken(fresh, "root", true, &added);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_EQ(stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ServerConfig f;
  f.allow_root_jobs = true;
  ASSERT_TRUE(LoadServerConfig(fresh, &f).ok());
  ASSERT_EQ(f.tokens.size(), 1u);
  EXPECT_EQ(f.tokens[0].token, *made);
}

TEST(ServerConfig, RuntimeLimitsAndRetentionAreReadAndCheckedWithTheirLine) {
  ServerConfig c;
  const std::string ok = Write("limits-ok",
                               "limits: {default_runtime: 2h, max_runtime: 7d}\n"
                               "retention: {jobs: 90d, logs: 0, environments: 1d}\n");
  ASSERT_TRUE(LoadServerConfig(ok, &c).ok());
  EXPECT_EQ(c.default_runtime_s, 7200);
  EXPECT_EQ(c.max_runtime_s, 7 * 86400);
  EXPECT_EQ(c.retention_jobs_s, 90 * 86400);
  EXPECT_EQ(c.retention_logs_s, 0) << "kept for good";
  EXPECT_EQ(c.retention_env_s, 86400);
  ServerConfig d;
  auto st = LoadServerConfig(
      Write("limits-bad", "limits:\n  default_runtime: 8d\n  max_runtime: 7d\n"), &d);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("limits.default_runtime: longer than limits.max_runtime"));
  st = LoadServerConfig(Write("retention-bad", "retention:\n  logs: forever\n"), &d);
  EXPECT_THAT(std::string(st.message()), HasSubstr(":2: retention.logs: expected an age"));
  st = LoadServerConfig(Write("retention-key", "retention: {log: 1d}\n"), &d);
  EXPECT_FALSE(st.ok());
}
}  // namespace
}  // namespace tessera::server
