#pragma once
// The server tests' fixture: a server on a fake clock with a fake launcher and a simulated machine,
// its API called in-process as a local user, its loop turned by hand (RunOnce).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "tessera/devices/simulated_source.h"
#include "tessera/server/fake_job_host.h"
#include "tessera/server/fake_launcher.h"
#include "tessera/server/server.h"
#include "tessera/shim/arbiter.h"
#include "tessera/shim/region.h"

namespace tessera::server::testing {

using nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "tessera-server-test-" + std::to_string(getpid());
    fs::remove_all(dir_);
    config_.socket = dir_ + "/s.sock";
    config_.state_dir = dir_ + "/state";
    config_.confinement = "off";  // jobs of the fake launcher are no processes
    config_.simulate = "t4x2";    // two GPUs
    config_.podman = "";
    config_.allow_root_jobs = true;  // the test's jobs are its own user's, root in CI
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  void StartServer(bool health = false) {
    server_.reset();
    ServerDeps deps;
    deps.clock = &clock_;
    deps.launcher = &launcher_;
    if (host_) deps.host = host_.get();
    if (own_source_) {
      auto machine = devices::LoadSimulatedMachine(config_.simulate);
      ASSERT_TRUE(machine.ok()) << machine.status();
      auto source = std::make_unique<devices::SimulatedSource>(*std::move(machine), clock_);
      source_ = source.get();
      deps.source = std::move(source);
    }
    auto s = Server::Create(config_, std::move(deps));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->Start({.listen = false, .loop = false, .health = health}).ok());
  }

  json Call(const std::string& method, const std::string& path, const json& body = nullptr,
            int* status = nullptr, uid_t uid = geteuid()) {
    net::HttpRequest r;
    r.method = method;
    r.target = path;
    r.path = path.substr(0, path.find('?'));
    // The query, as the listener splits it (plain names and values only, in these tests).
    for (size_t at = path.find('?'); at != std::string::npos;) {
      const size_t amp = path.find('&', at + 1);
      const std::string kv = path.substr(at + 1, amp == std::string::npos ? amp : amp - at - 1);
      r.query[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
      at = amp;
    }
    r.content_type = "application/json";
    if (!body.is_null()) r.body = body.dump();
    r.peer.unix_socket = true;
    r.peer.uid = uid;
    net::HttpResponse out = server_->Handle(r);
    if (status) *status = out.status;
    return json::parse(out.body, nullptr, false);
  }
  int64_t Submit(int gpus, double seconds, int priority = 0, json extra = json::object()) {
    json spec = {{"command", {"sleep", std::to_string(seconds)}}, {"priority", priority}};
    if (gpus > 0) spec["resources"] = {{"gpus", gpus}};
    spec.update(extra);
    int status = 0;
    json j = Call("POST", "/v1/jobs", spec, &status);
    EXPECT_EQ(status, 201) << j.dump();
    return j.value("id", int64_t{0});
  }
  json Job(int64_t id) { return Call("GET", "/v1/jobs/" + std::to_string(id)); }
  std::string State(int64_t id) { return Job(id).value("state", ""); }
  void Advance(double seconds) {
    clock_.Advance(
        std::chrono::duration_cast<core::Duration>(std::chrono::duration<double>(seconds)));
  }
  // Turns the loop until it has nothing more to do at this time.
  void Settle() {
    for (int i = 0; i < 100 && server_->RunOnce(); ++i) {
    }
  }
  std::vector<int64_t> StartedJobs() const {
    std::vector<int64_t> ids;
    for (const auto& s : launcher_.started()) ids.push_back(s.job_id);
    return ids;
  }

  std::string dir_;
  ServerConfig config_;
  bool own_source_ = false;  // StartServer makes the simulated GPUs (source_) itself
  devices::SimulatedSource* source_ = nullptr;
  core::FakeClock clock_{core::TimePoint(std::chrono::seconds(1'800'000'000))};
  FakeLauncher launcher_{clock_, /*stop_latency_s=*/2};
  // Set before StartServer: the server's jobs run on it (over launcher_) instead of this machine.
  std::unique_ptr<FakeJobHost> host_;
  std::unique_ptr<Server> server_;
};

}  // namespace tessera::server::testing
