#pragma once
// A fake kubelet for the agent's tests, speaking the real gRPC over unix sockets: the
// Registration server on <dir>/kubelet.sock, a device-plugin client that drives a registered plugin
// as the kubelet's device manager does (checks the request, GetDevicePluginOptions, then one
// ListAndWatch stream kept open; GetPreferredAllocation and Allocate on demand), and a
// PodResources server listing the pods the test says hold devices. Restart() behaves like a
// kubelet restart: every socket in the folder is deleted and a new kubelet.sock served.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "podresources/v1/api.grpc.pb.h"

namespace tessera::test {

class FakeKubelet {
 public:
  struct Plugin {
    v1beta1::RegisterRequest request;
    v1beta1::DevicePluginOptions options;
    std::vector<v1beta1::Device> devices;  // the latest ListAndWatch list
    int lists = 0;                         // ListAndWatch messages received
    std::chrono::steady_clock::time_point last_list{};
    std::set<std::string> ever_unhealthy;  // IDs some list said were Unhealthy
  };
  struct PodDevices {
    std::string ns, pod, container, resource;
    std::vector<std::string> ids;
  };

  // `dir`: the device-plugin folder; `pod_resources_socket`: where PodResources is served (empty:
  // not served).
  FakeKubelet(std::string dir, std::string pod_resources_socket);
  ~FakeKubelet();

  void Start();
  void Stop();     // stops serving (the sockets are left, as a crashed kubelet leaves them)
  void Restart();  // Stop, delete every socket in the folder, Start

  // Waits until `pred` holds over the plugins (by resource name), or `timeout` passes.
  bool WaitFor(const std::function<bool(const std::map<std::string, Plugin>&)>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10));
  std::map<std::string, Plugin> plugins();
  int registrations();
  std::vector<std::string> register_errors();

  // What the device manager sends; grpc status and the response.
  grpc::Status Allocate(const std::string& resource,
                        const std::vector<std::vector<std::string>>& ids,
                        v1beta1::AllocateResponse* out);
  grpc::Status Preferred(const std::string& resource, const std::vector<std::string>& available,
                         const std::vector<std::string>& must, int size,
                         std::vector<std::string>* out);

  // PodResources contents.
  void SetPods(std::vector<PodDevices> pods);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::test
