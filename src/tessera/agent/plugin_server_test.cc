#include "tessera/agent/plugin_server.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "fake_kubelet.h"
#include "tessera/devices/simulated_source.h"

namespace tessera::agent {
namespace {

namespace fs = std::filesystem;

// The kubelet down for long (the agent's backoff grown to an hour here), then back: the agent
// registers as soon as kubelet.sock appears, not when its backoff ends.
TEST(PluginServer, RegistersAsSoonAsKubeletSockReappears) {
  const std::string dir = ::testing::TempDir() + "plugin-server-" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir + "/dp");
  auto m = devices::LoadSimulatedMachine("t4x2");
  ASSERT_TRUE(m.ok()) << m.status();
  PluginOptions po;
  po.state_dir = dir + "/state";
  auto state = DeviceState::Create(m->inventory, po);
  ASSERT_TRUE(state.ok()) << state.status();
  PluginServerOptions o;
  o.plugin_dir = dir + "/dp";
  o.initial_backoff = std::chrono::hours(1);
  o.max_backoff = std::chrono::hours(1);
  PluginServer server(**state, o, nullptr, [] {});
  ASSERT_TRUE(server.Start().ok());
  // Its first try found no kubelet; the next is an hour away.
  test::FakeKubelet kubelet(dir + "/dp", "");
  kubelet.Start();
  EXPECT_TRUE(
      kubelet.WaitFor([](const auto& plugins) { return plugins.contains("tessera.io/gpu"); },
                      std::chrono::seconds(20)))
      << "registered only when the backoff ended";
  // (the agent counts its registration once the kubelet's answer is back: a moment later)
  const auto counted = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (server.counters().registrations.load() < 1 && std::chrono::steady_clock::now() < counted)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(server.counters().registrations.load(), 1u);
  // A kubelet restart (every socket deleted, a new kubelet.sock): registered again at once.
  kubelet.Restart();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (kubelet.registrations() < 2 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GE(kubelet.registrations(), 2);
  server.Stop();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::agent
