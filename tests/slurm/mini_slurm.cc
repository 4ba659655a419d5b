#include "mini_slurm.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "../capture.h"
#include "fmt/format.h"
#include "tessera/net/http.h"

namespace tessera::slurm_test {
namespace {

namespace fs = std::filesystem;

std::string ShortHostname() {
  char h[256] = {};
  gethostname(h, sizeof h - 1);
  std::string s = h;
  return s.substr(0, s.find('.'));
}

// Starts `argv` in the foreground as a child that dies with this process (PR_SET_PDEATHSIG: a
// test killed by its timeout leaves no daemon behind), its output appended to `log`.
pid_t Daemon(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
  setenv("SLURM_CONF", (fs::path(log).parent_path().parent_path() / "slurm.conf").c_str(), 1);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

// Stops `pid` with `sig`, SIGKILL after `grace`; reaps it.
void StopChild(pid_t pid, int sig, std::chrono::milliseconds grace) {
  if (pid <= 0) return;
  kill(pid, sig);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (waitpid(pid, nullptr, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Where the cluster's folder goes: the test run's own folder (tests/test_main.cc sets TEST_TMPDIR,
// as ::testing::TempDir() reads it), else $TMPDIR or /tmp (a benchmark's); with a trailing slash.
std::string TempRoot() {
  for (const char* var : {"TEST_TMPDIR", "TMPDIR"}) {
    const char* v = getenv(var);
    if (v && *v) return std::string(v).back() == '/' ? v : std::string(v) + "/";
  }
  return "/tmp/";
}

}  // namespace

std::string MiniSlurm::Unavailable(bool accounting) {
  for (const char* p : {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged",
                        "/usr/bin/srun", "/usr/bin/sbatch"}) {
    if (access(p, X_OK) != 0)
      return std::string(p) +
             " is missing: Debian's slurm-wlm and munge (scripts/deps installs them)";
  }
  for (const char* p : {"/usr/sbin/slurmdbd", "/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db",
                        "/usr/bin/mariadb"}) {
    if (accounting && access(p, X_OK) != 0)
      return std::string(p) +
             " is missing: Debian's slurmdbd and mariadb-server (scripts/deps installs them)";
  }
  if (geteuid() != 0) return "a Slurm of its own needs root (SlurmUser, mknod)";
  return "";
}

MiniSlurm::MiniSlurm(const Options& options) : options_(options) {
  // Under the test run's own folder (tests/test_main.cc: removed when the tests end, and by the
  // next run when a test was killed), never beside it in /tmp.
  std::string tmpl = TempRoot() + "slurm-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    error_ = "mkdtemp " + tmpl + " failed";
    return;
  }
  dir_ = tmpl;
  // Every user passes through the folders above it too (jobs run as other users): the run's own
  // folder made so (never /tmp itself).
  if (const char* own = getenv("TEST_TMPDIR"); own && *own) chmod(own, 0711);
  // Every user passes through (munge's socket folder must be, and jobs run as other users).
  chmod(dir_.c_str(), 0755);
  for (const char* d : {"munge", "state", "spool", "log", "dev"})
    fs::create_directories(dir_ + "/" + d);
  chmod((dir_ + "/munge").c_str(), 0755);
  {
    std::ofstream key(dir_ + "/munge/munge.key");
    std::ifstream random("/dev/urandom");
    char buf[1024];
    random.read(buf, sizeof buf);
    key.write(buf, sizeof buf);
  }
  chmod((dir_ + "/munge/munge.key").c_str(), 0400);
  for (int i = 0; i < 2; ++i) {
    const std::string dev = dir_ + "/dev/nvidia" + std::to_string(i);
    if (mknod(dev.c_str(), S_IFCHR | 0666, makedev(195, i)) != 0) {
      error_ = "mknod " + dev + " failed";
      return;
    }
  }
  const std::string host = ShortHostname();
  const int ctld = net::FreeLoopbackPort(), slurmd = net::FreeLoopbackPort();
  const bool several = options_.nodes > 1;
  if (several) {
    for (int i = 0; i < options_.nodes; ++i) nodes_.push_back(std::string("node-") + char('a' + i));
  } else {
    nodes_.push_back(host);
  }
  // Each node's line (several: its own slurmd port) and its GPUs in gres.conf.
  std::string node_lines, gres_lines;
  for (const std::string& node : nodes_) {
    node_lines += fmt::format(
        "NodeName={} NodeAddr=127.0.0.1{} CPUs=2 RealMemory=1000 Gres=gpu:2,shard:{} "
        "State=UNKNOWN\n",
        node, several ? fmt::format(" Port={}", net::FreeLoopbackPort()) : std::string(),
        2 * options_.shards_per_gpu);
    gres_lines += fmt::format("NodeName={} Name=gpu File={}/dev/nvidia[0-1]\n", node, dir_);
    for (int gpu = 0; gpu < 2; ++gpu)
      gres_lines += fmt::format("NodeName={} Name=shard Count={} File={}/dev/nvidia{}\n", node,
                                options_.shards_per_gpu, dir_, gpu);
  }
  // (A slurmd per node: its spool, pid and log files by its name, %n.)
  const std::string slurmd_file = several ? "slurmd-%n" : "slurmd";
  if (options_.accounting) dbd_port_ = net::FreeLoopbackPort();
  std::ofstream(dir_ + "/slurm.conf")
      << "ClusterName=tessera-test\n"
      << "SlurmctldHost=" << host << "(127.0.0.1)\n"
      << "SlurmctldPort=" << ctld << "\nSlurmdPort=" << slurmd << "\n"
      << "SlurmUser=root\nSlurmdUser=root\n"
      << "AuthType=auth/munge\nCredType=cred/munge\n"
      << "AuthInfo=socket=" << dir_ << "/munge/munge.sock"
      << (options_.cred_expire_s > 0 ? fmt::format(",cred_expire={}", options_.cred_expire_s)
                                     : std::string())
      << "\n"
      << "StateSaveLocation=" << dir_ << "/state\n"
      << "SlurmdSpoolDir=" << dir_ << (several ? "/spool-%n\n" : "/spool\n")
      << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\n"
      << "SlurmdPidFile=" << dir_ << "/" << slurmd_file << ".pid\n"
      << "SlurmctldLogFile=" << dir_ << "/log/slurmctld.log\n"
      << "SlurmdLogFile=" << dir_ << "/log/" << slurmd_file << ".log\n"
      << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
      // With accounting, Slurm's own per-task figures (TotalCPU, MaxRSS) as a site gathers them,
      // sampled each second (a site's default is 30) so that a short test job has its samples.
      << (options_.accounting ? "JobAcctGatherType=jobacct_gather/linux\n"
                                "JobAcctGatherFrequency=task=1\n"
                              : "JobAcctGatherType=jobacct_gather/none\n")
      << (options_.accounting
              // (AccountingStoragePass: the munge socket that talks to slurmdbd; TRES: GPUs and
              // shards are recorded only when named, as docs/slurm.md tells a site.)
              ? fmt::format("AccountingStorageType=accounting_storage/slurmdbd\n"
                            "AccountingStorageHost=127.0.0.1\nAccountingStoragePort={}\n"
                            "AccountingStoragePass={}/munge/munge.sock\n"
                            "AccountingStorageTRES=gres/gpu,gres/shard\n",
                            dbd_port_, dir_)
              : std::string("AccountingStorageType=accounting_storage/none\n"))
      << "JobCompType=jobcomp/none\n"
      << "SchedulerType=sched/backfill\nSelectType=select/cons_tres\n"
      << "SelectTypeParameters=CR_Core\n"
      << "SchedulerParameters=batch_sched_delay=0,sched_interval=1\n"
      << "GresTypes=gpu,shard\nReturnToService=2\n"
      << "PlugStackConfig=" << dir_ << "/plugstack.conf\n"
      << node_lines << "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n";
  std::ofstream(dir_ + "/gres.conf") << gres_lines;
  SetPluginArgs(options_.plugin_args);
  const std::string conf = dir_ + "/slurm.conf", log = dir_ + "/log/";
  munged_ =
      Daemon({"/usr/sbin/munged", "-F", "--socket=" + dir_ + "/munge/munge.sock",
              "--key-file=" + dir_ + "/munge/munge.key", "--pid-file=" + dir_ + "/munge/munged.pid",
              "--log-file=" + log + "munge.log", "--seed-file=" + dir_ + "/munge/seed", "-f"},
             log + "munged.out");
  // Slurm's daemons need munge's socket from their start.
  const auto munge_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fs::exists(dir_ + "/munge/munge.sock") && std::chrono::steady_clock::now() < munge_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (options_.accounting && !StartAccounting(host)) return;
  slurmctld_ = Daemon({"/usr/sbin/slurmctld", "-D", "-i", "-f", conf}, log + "slurmctld.out");
  for (const std::string& node : nodes_) {
    if (several) {
      slurmd_.push_back(Daemon({"/usr/sbin/slurmd", "-D", "-N", node, "-f", conf},
                               log + "slurmd-" + node + ".out"));
    } else {
      slurmd_.push_back(Daemon({"/usr/sbin/slurmd", "-D", "-f", conf}, log + "slurmd.out"));
    }
  }
  // Up when the node is idle (registered, its gres counted).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (error_.empty()) {
    auto s = test::Capture(Env() + "sinfo -h -o %T 2>&1");
    if (s.out == "idle\n") break;
    if (std::chrono::steady_clock::now() > deadline) {
      error_ = "the node did not become idle in 30 s (sinfo: " + s.out + ")\n" + Logs();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool MiniSlurm::StartAccounting(const std::string& host) {
  const std::string db = dir_ + "/mysql", log = dir_ + "/log/", sock = dir_ + "/mysql.sock";
  auto init =
      test::Capture("/usr/bin/mariadb-install-db --no-defaults --user=root --datadir=" + db +
                    " --auth-root-authentication-method=normal --skip-test-db > " + log +
                    "mariadb-install.log 2>&1");
  if (init.code != 0) {
    error_ = "mariadb-install-db failed\n" + Logs();
    return false;
  }
  const int db_port = net::FreeLoopbackPort();
  mariadbd_ = Daemon({"/usr/sbin/mariadbd", "--no-defaults", "--user=root", "--datadir=" + db,
                      "--socket=" + sock, "--port=" + std::to_string(db_port),
                      "--bind-address=127.0.0.1", "--pid-file=" + dir_ + "/mysql.pid",
                      "--innodb-buffer-pool-size=16M", "--log-error=" + log + "mariadb.log"},
                     log + "mariadbd.out");
  const std::string sql = "/usr/bin/mariadb --no-defaults --socket=" + sock + " -u root -e ";
  const auto db_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (test::Capture(sql + "'SELECT 1' 2>&1").code != 0) {
    if (std::chrono::steady_clock::now() > db_by) {
      error_ = "MariaDB did not answer in 30 s\n" + Logs();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // slurmdbd's own account, over TCP as a site's would be.
  auto grant =
      test::Capture(sql +
                    "\"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; GRANT ALL ON "
                    "slurm_acct_db.* TO 'slurm'@'127.0.0.1';\" 2>&1");
  if (grant.code != 0) {
    error_ = "MariaDB refused slurmdbd's account: " + grant.out;
    return false;
  }
  {
    // Read by slurmdbd from beside slurm.conf; its owner's alone (it holds the password).
    const std::string conf = dir_ + "/slurmdbd.conf";
    std::ofstream(conf) << "AuthType=auth/munge\nAuthInfo=socket=" << dir_ << "/munge/munge.sock\n"
                        << "DbdAddr=127.0.0.1\nDbdHost=" << host << "\nDbdPort=" << dbd_port_
                        << "\nSlurmUser=root\nStorageType=accounting_storage/mysql\n"
                        << "StorageHost=127.0.0.1\nStoragePort=" << db_port
                        << "\nStorageUser=slurm\nStoragePass=slurm\nStorageLoc=slurm_acct_db\n"
                        << "LogFile=" << log << "slurmdbd.log\nPidFile=" << dir_
                        << "/slurmdbd.pid\n";
    chmod(conf.c_str(), 0600);
  }
  slurmdbd_ = Daemon({"/usr/sbin/slurmdbd", "-D"}, log + "slurmdbd.out");
  // Up when it takes the cluster (its database made on its first start).
  const auto dbd_by = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    auto add = test::Capture(Env() + "sacctmgr -i add cluster tessera-test 2>&1");
    if (add.code == 0 || add.out.find("already exists") != std::string::npos) break;
    if (std::chrono::steady_clock::now() > dbd_by) {
      error_ = "slurmdbd did not take the cluster in 60 s (sacctmgr: " + add.out + ")\n" + Logs();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // An account with root and nobody in it, as a site has its users' associations.
  for (const std::string& line :
       {std::string("add account tessera Cluster=tessera-test"),
        std::string("add user root,nobody Account=tessera DefaultAccount=tessera")}) {
    auto r = test::Capture(Env() + "sacctmgr -i " + line + " 2>&1");
    if (r.code != 0) {
      error_ = "sacctmgr " + line + ": " + r.out;
      return false;
    }
  }
  return true;
}

void MiniSlurm::SetPluginArgs(const std::string& args, const std::string& plugin) {
  std::ofstream conf(dir_ + "/plugstack.conf");
  if (options_.plugin.empty()) return;  // a plain Slurm (the benchmarks' baseline)
  conf << "required " << (plugin.empty() ? options_.plugin : plugin) << " " << args
       << " state_dir=" << PluginStateDir() << (options_.nodes > 1 ? "/%n" : "") << "\n";
}

std::string MiniSlurm::Logs() const {
  std::string out;
  std::vector<std::string> logs = {"slurmctld.log", "munge.log", "slurmctld.out", "munged.out"};
  for (const std::string& node : nodes_) {
    const std::string name = options_.nodes > 1 ? "slurmd-" + node : "slurmd";
    logs.push_back(name + ".log");
    logs.push_back(name + ".out");
  }
  if (options_.accounting)
    logs.insert(logs.end(), {"slurmdbd.log", "slurmdbd.out", "mariadb.log", "mariadb-install.log"});
  for (const std::string& log : logs) {
    out += std::string("--- ") + log + "\n" +
           test::Capture("tail -n 20 " + dir_ + "/log/" + log + " 2>&1").out;
  }
  return out;
}

void MiniSlurm::Stop() {
  // slurmd first, with the controller still there (it may need SIGKILL while it retries
  // registering with one that is gone); the controller's and munge's state is thrown away with
  // the folder, so they need no orderly stop (each would take 2 s).
  for (const pid_t slurmd : slurmd_) kill(slurmd, SIGTERM);
  for (const pid_t slurmd : slurmd_) StopChild(slurmd, SIGTERM, std::chrono::seconds(3));
  StopChild(slurmctld_, SIGKILL, std::chrono::seconds(3));
  StopChild(slurmdbd_, SIGKILL, std::chrono::seconds(3));
  StopChild(mariadbd_, SIGKILL, std::chrono::seconds(3));
  StopChild(munged_, SIGKILL, std::chrono::seconds(3));
}

MiniSlurm::~MiniSlurm() {
  Stop();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace tessera::slurm_test
